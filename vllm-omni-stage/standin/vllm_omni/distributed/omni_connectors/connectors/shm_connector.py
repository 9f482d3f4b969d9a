"""Stand-in for vllm_omni/distributed/omni_connectors/connectors/shm_connector.py
(vllm-project/vllm-omni@0342827dd787296b8a6b1e9f523ebaa24d13c714):
``SharedMemoryConnector``, a key-addressed store on one host.

Upstream writes each ``put`` into a POSIX shared-memory segment named by
the key (``shm_write_bytes(payload, name=put_key)``) and ``get`` opens the
segment of that name, so a writer in one process and a reader in another
meet by key alone. The stand-in's engine runs in the worker's process, so
its segments are one process-wide table (a lock guards it: upstream's reader
is the adapter's background thread). ``get`` answers ``(object, size)`` or
None when nothing is under the key, and consumes it; ``cleanup(request_id)``
drops what is left under keys that begin with ``request_id + "_"``; with
OMNIPD_STANDIN_RECORD each put, get and cleanup is recorded with how many
segments remain."""

from __future__ import annotations

import copy
import json
import threading
from typing import Any

from vllm_omni import _toy

_LOCK = threading.Lock()
_SEGMENTS: dict[str, Any] = {}


def _size(data: Any) -> int:
    return len(json.dumps(data, default=str))


class SharedMemoryConnector:
    """Key-addressed local shared-memory connector."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.stage_id = config.get("stage_id", -1)

    def put(self, from_stage: str, to_stage: str, put_key: str, data: Any) -> tuple[bool, int, dict[str, Any] | None]:
        size = _size(data)
        with _LOCK:
            _SEGMENTS[put_key] = copy.deepcopy(data)
            left = len(_SEGMENTS)
        _toy.record("connector_put", key=put_key, from_stage=from_stage, to_stage=to_stage, segments=left)
        return True, size, {"shm": {"name": put_key, "size": size}, "size": size}

    def get(self, from_stage: str, to_stage: str, get_key: str, metadata: Any = None) -> tuple[Any, int] | None:
        with _LOCK:
            data = _SEGMENTS.pop(get_key, None)
            left = len(_SEGMENTS)
        if data is None:
            return None
        _toy.record("connector_get", key=get_key, segments=left)
        return data, _size(data)

    def cleanup(self, request_id: str) -> None:
        with _LOCK:
            stale = [k for k in _SEGMENTS if k == request_id or k.startswith(request_id + "_")]
            for k in stale:
                del _SEGMENTS[k]
            left = len(_SEGMENTS)
        _toy.record("connector_cleanup", request_id=request_id, dropped=len(stale), segments=left)

    def health(self) -> dict[str, Any]:
        return {"status": "healthy"}

    def close(self) -> None:
        pass


_toy.drop_interfaces(globals(), __name__)
