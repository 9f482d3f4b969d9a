"""Stand-in for vllm_omni/distributed/omni_connectors/utils/config.py
(vllm-project/vllm-omni@0342827dd787296b8a6b1e9f523ebaa24d13c714):
``ConnectorSpec(name, extra)``, a connector's name in the factory and its
backend configuration (``extra["stage_id"]`` is the stage that owns it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_omni import _toy


@dataclass
class ConnectorSpec:
    """Specification for a connector instance."""

    name: str
    extra: dict[str, Any] = field(default_factory=dict)


_toy.drop_interfaces(globals(), __name__)
