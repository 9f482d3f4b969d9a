"""Stand-in for vllm_omni/distributed/omni_connectors/factory.py
(vllm-project/vllm-omni@0342827dd787296b8a6b1e9f523ebaa24d13c714):
``OmniConnectorFactory.create_connector(spec)`` builds the connector
registered under ``spec.name`` from ``spec.extra``; an unknown name is
upstream's ``ValueError("Unknown connector: X. Available: [...]")``. Only
``SharedMemoryConnector`` is registered here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_omni import _toy
from vllm_omni.distributed.omni_connectors.connectors.shm_connector import SharedMemoryConnector
from vllm_omni.distributed.omni_connectors.utils.config import ConnectorSpec


class OmniConnectorFactory:
    """Factory for creating OmniConnectors."""

    _registry: dict[str, Callable[[dict[str, Any]], Any]] = {}

    @classmethod
    def register_connector(cls, name: str, constructor: Callable[[dict[str, Any]], Any]) -> None:
        if name in cls._registry:
            raise ValueError(f"Connector '{name}' is already registered.")
        cls._registry[name] = constructor

    @classmethod
    def create_connector(cls, spec: ConnectorSpec) -> Any:
        if spec.name not in cls._registry:
            raise ValueError(f"Unknown connector: {spec.name}. Available: {list(cls._registry.keys())}")
        return cls._registry[spec.name](spec.extra)

    @classmethod
    def list_registered_connectors(cls) -> list[str]:
        return list(cls._registry.keys())


OmniConnectorFactory.register_connector("SharedMemoryConnector", SharedMemoryConnector)

_toy.drop_interfaces(globals(), __name__)
