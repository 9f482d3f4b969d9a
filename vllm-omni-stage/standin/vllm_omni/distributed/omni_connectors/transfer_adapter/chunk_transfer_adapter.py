"""Stand-in for vllm_omni/distributed/omni_connectors/transfer_adapter/
chunk_transfer_adapter.py (vllm-project/vllm-omni@0342827dd787296b8a6b1e9f523ebaa24d13c714):
the engine-side half of async chunk, as the stand-in's engine uses it.

Upstream, ``OmniChunkTransferAdapter`` is built by the AR scheduler when the
stage's model config has ``async_chunk`` (core/sched/omni_ar_scheduler.py),
with the connector its ``stage_connector_config`` names
(``SharedMemoryConnector`` by default, ``extra["stage_id"]`` the stage's
own id, engine/arg_utils.py). A request it has not seen finish is parked in
``WAITING_FOR_CHUNK`` each scheduling round and its background loop polls
``connector.get(str(stage_id - 1), str(stage_id),
f"{external_req_id}_{stage_id - 1}_{chunk}")`` with chunk counting up
from 0; an AR stage's chunk replaces the request's ``additional_information``
and ``meta.finished`` ends the polling (``_poll_single_request``). On stage
0 ``load_async`` returns at once: stage 0 has no upstream producer.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from vllm_omni import _toy
from vllm_omni.distributed.omni_connectors.factory import OmniConnectorFactory
from vllm_omni.distributed.omni_connectors.utils.config import ConnectorSpec


def _truthy(v: Any) -> bool:
    if hasattr(v, "item"):
        return bool(v.item())
    return bool(v) if v is not None else False


class OmniChunkTransferAdapter:
    """Per-request chunk reception for one stage."""

    def __init__(self, stage_connector_config: dict[str, Any]) -> None:
        spec = ConnectorSpec(name=stage_connector_config.get("name", "SharedMemoryConnector"),
                             extra=dict(stage_connector_config.get("extra", {})))
        self.connector = OmniConnectorFactory.create_connector(spec)
        self.get_req_chunk: dict[str, int] = defaultdict(int)
        self.finished_requests: set[str] = set()

    def poll(self, request_id: str, external_req_id: str) -> dict[str, Any] | None:
        """The request's next chunk, or None when it has not arrived (or
        this is stage 0, which never polls)."""
        stage_id = int(self.connector.stage_id)
        if stage_id == 0 or request_id in self.finished_requests:
            return None
        chunk = self.get_req_chunk[request_id]
        key = f"{external_req_id}_{stage_id - 1}_{chunk}"
        got = self.connector.get(str(stage_id - 1), str(stage_id), key)
        if got is None:
            return None
        payload, _ = got
        self.get_req_chunk[request_id] += 1
        if _truthy((payload.get("meta") or {}).get("finished")):
            self.finished_requests.add(request_id)
        return payload

    def cleanup(self, request_id: str) -> None:
        self.get_req_chunk.pop(request_id, None)
        self.finished_requests.discard(request_id)


_toy.drop_interfaces(globals(), __name__)
