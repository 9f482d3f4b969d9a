"""Feeding a running vllm-omni Talker request its rows: the worker plays
stage 0's part of vllm-omni's async chunk.

Read at vllm-project/vllm-omni@0342827dd787296b8a6b1e9f523ebaa24d13c714 (main,
June 2026; the newest commit stored whole: no v0.32.0 tree was there to read):

* The Talker engine, built with ``async_chunk`` and its pipeline stage id
  (engine.py), has a chunk transfer adapter
  (vllm_omni/distributed/omni_connectors/transfer_adapter/chunk_transfer_adapter.py)
  whose connector comes from the stage's ``stage_connector_config``,
  ``SharedMemoryConnector`` when none is configured, with the stage's own
  id (vllm_omni/engine/arg_utils.py, ``create_model_config``). The adapter
  parks each request in ``WAITING_FOR_CHUNK`` and polls
  ``get(str(stage - 1), str(stage), f"{external_req_id}_{stage - 1}_{chunk}")``
  for chunk 0, 1, … until one has ``meta.finished``; an AR stage's chunk
  becomes the request's ``additional_information``.
* ``SharedMemoryConnector`` is addressed by key alone (a POSIX shared-memory
  segment named by the key,
  vllm_omni/distributed/omni_connectors/connectors/shm_connector.py), so
  the worker's own connector, made by ``OmniConnectorFactory`` in this
  process, writes what the engine's process reads.
* The chunks are what ``thinker2talker_async_chunk`` builds
  (vllm_omni/model_executor/stage_input_processors/qwen3_omni.py): chunk 0
  the prompt's rows and the first reply row (``embed.prefill``,
  ``hidden_states.output``, ``embed.tts_bos/eos/pad``, ``ids.all``,
  ``ids.prompt``), then one ``embed.decode`` row per chunk; ``meta.finished``
  on the last. The adapter also sends a chunk of ``meta`` alone when a
  request finishes with no row to add (``_send_single_request``); the
  Talker then feeds tts_eos (qwen3_omni.py,
  ``_thinker_decode_to_talker_decode``).
* The Talker's placeholder prompt is ``[0] * compute_talker_prompt_ids_length(
  prompt_ids)`` (vllm_omni/distributed/omni_connectors/adapter.py), as the
  orchestrator's async-chunk prewarm builds it (vllm_omni/engine/orchestrator.py,
  ``_prewarm_async_chunk_stages``).
* The key's ``external_req_id`` is the engine's own id, ``{id}-{uuid8}``
  (vllm_omni/entrypoints/async_omni.py ``_get_unique_request_id``; the
  engine sets ``request.external_req_id`` to it,
  vllm_omni/engine/async_omni_engine.py). The worker finds it in
  ``AsyncOmni.request_states`` (internal id → ``ClientRequestState`` with
  ``external_request_id``), the one place it is kept.

All of this but the factory and the connector's ``put`` is private to
vllm-omni; it is pinned here, in one module, to that one commit.
"""

from __future__ import annotations

import asyncio
from typing import Any

from . import tensors
from .errors import APIError
from .stash import Stash

PINNED = "vllm-project/vllm-omni@0342827dd787296b8a6b1e9f523ebaa24d13c714"
CONNECTOR = "SharedMemoryConnector"  # what the adapter builds when the stage names none
# The engine registers a request at once; only a hang reaches this.
REGISTER_BOUND_S = 60.0


def prompt(prompt_token_ids: list[int]) -> dict[str, Any]:
    """The Talker's placeholder prompt for a Thinker prompt."""
    from vllm_omni.distributed.omni_connectors.adapter import compute_talker_prompt_ids_length  # noqa: PLC0415

    return {"prompt_token_ids": [0] * max(1, compute_talker_prompt_ids_length(list(prompt_token_ids)))}


async def engine_request_id(engine: Any, request_id: str, started: asyncio.Future[Any],
                            taken: set[str]) -> str | None:
    """The engine's own id for the request just submitted as request_id
    (one not in taken: another request of the same id holds it); None when
    the engine answered before registering it (it refused the request)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + REGISTER_BOUND_S
    while True:
        for internal, st in list((getattr(engine, "request_states", None) or {}).items()):
            if getattr(st, "external_request_id", None) == request_id and internal not in taken:
                return str(internal)
        if started.done():
            return None
        if loop.time() > deadline:
            raise APIError(500, f"the engine never registered request {request_id}", type_="server_error")
        await asyncio.sleep(0.001)  # the engine's own task registers it


def _flag(v: bool) -> Any:
    try:
        import torch  # noqa: PLC0415 - only a real engine's process has it
    except ImportError:
        return v
    return torch.tensor(v, dtype=torch.bool)


class ChunkFeed:
    """The chunks of one Talker request, written under the keys its
    engine's adapter polls."""

    def __init__(self, engine_request_id: str, stage_id: int) -> None:
        from vllm_omni.distributed.omni_connectors import ConnectorSpec, OmniConnectorFactory  # noqa: PLC0415

        self.key = engine_request_id
        self.from_stage, self.to_stage = str(stage_id - 1), str(stage_id)
        self.connector = OmniConnectorFactory.create_connector(
            ConnectorSpec(name=CONNECTOR, extra={"stage_id": stage_id - 1}))
        self.chunks = 0
        self.rows = 0  # conditioning rows put so far
        self.finished = False

    def _put(self, payload: dict[str, Any], finished: bool) -> None:
        payload["meta"] = {"finished": _flag(finished)}
        ok, _, _ = self.connector.put(self.from_stage, self.to_stage, f"{self.key}_{self.from_stage}_{self.chunks}",
                                      payload)
        if not ok:
            raise APIError(500, f"the Talker's input connector refused chunk {self.chunks}", type_="server_error")
        self.chunks += 1
        self.finished = finished

    def put(self, acc: Stash, end: bool) -> None:
        """Puts what acc holds beyond the rows put: chunk 0 once it has the
        prompt's rows and the first reply row (or the Thinker ended), then
        one chunk per row; the last is marked finished once end says no row
        follows."""
        p = len(acc.prompt_token_ids)
        if self.finished:
            return
        if self.chunks == 0:
            if acc.rows < p + 1 and not end:
                return
            n = min(acc.rows, p + 1)
            ew, hw, tw = acc.embed_width, acc.hidden_width, acc.tts_width
            self._put({
                "embed": {"prefill": tensors.engine_rows(bytes(acc.embed[:4 * n * ew]), n, ew),
                          **{role: tensors.engine_vector(bytes(acc.tts[4 * tw * i:4 * tw * (i + 1)]))
                             for i, role in enumerate(("tts_pad", "tts_bos", "tts_eos"))}},
                "hidden_states": {"output": tensors.engine_rows(bytes(acc.hidden[:4 * n * hw]), n, hw)},
                "ids": {"all": list(acc.token_ids), "prompt": list(acc.prompt_token_ids)},
            }, end and acc.rows == n)
            self.rows = n
        ew = acc.embed_width
        while self.rows < acc.rows:
            i = self.rows
            self._put({"embed": {"decode": tensors.engine_rows(bytes(acc.embed[4 * i * ew:4 * (i + 1) * ew]), 1, ew)}},
                      end and i == acc.rows - 1)
            self.rows += 1
        if end and not self.finished:
            self._put({}, True)  # the rows ended after the last chunk put

    def release(self) -> None:
        """Drops the chunks the engine did not read (the request ended
        early, failed or was cancelled)."""
        self.connector.cleanup(self.key)
