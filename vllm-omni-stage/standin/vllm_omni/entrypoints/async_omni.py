"""Stand-in for vllm_omni/entrypoints/async_omni.py (vllm-omni v0.32.0):
``AsyncOmni(model=..., deploy_config=...)`` built from a one-stage deploy
config, with upstream's ``generate`` signature, ``abort(request_id, *,
timeout=None)`` by external request id, ``get_tokenizer()`` and the vLLM
``EngineClient`` attribute ``model_config``.

``generate`` yields ``OmniRequestOutput`` objects as upstream does in DELTA
mode: ``outputs[0].text`` / ``token_ids`` per step,
``outputs[0].cumulative_token_ids``, and ``outputs[0].multimodal_output``
accumulated over the request the way vllm-omni's output processor
accumulates it (vllm_omni/engine/output_processor.py
@00994b0143ecd84cc84e27dd9c42ce569f8a9c4f: a tensor after the first step, a
list of per-step tensors after later ones, one tensor once finished):

* Thinker: ``{"hidden_states": {"layers": {0: rows, 24: rows}}, "embed":
  {"tts_pad", "tts_bos", "tts_eos"}}`` (qwen3_omni.py captures layers 0 and
  ``talker_config.accept_hidden_layer``); one row per computed position,
  and on the last output one more, the forward of the last sampled token
  (as upstream's accumulator holds it: thinker2talker_full_payload trims it).
* Talker: ``{"codes": {"audio": [steps, 16]}}``, zero rows for the prefill
  positions first, then one frame per decode step (the frame of the token
  that step consumed), as qwen3_omni.py's talker fills
  ``code_predictor_codes``.
* Code2Wav: ``{"audio": [1, samples], "sr": 24000}`` (the generation
  runner's ``model_outputs`` under the modality key).

A Thinker prompt may carry ``multi_modal_data`` (what
vllm.entrypoints.chat_utils.parse_chat_messages_async returns): the
processor's work is done here, each item's one pad expanded into its
placeholder count, those positions' rows the item's; the outputs'
``prompt_token_ids`` are the processed prompt, as vLLM's.

Under PD (``kv_transfer_config`` in the stage's engine arguments) a
producer asked ``do_remote_decode`` returns NixlConnector's
``kv_transfer_params`` (vllm/distributed/kv_transfer/kv_connector/v1/
nixl_connector.py, ``request_finished``); a consumer given
``do_remote_prefill`` recomputes the prompt but reports, and emits rows, as
one that imported the first P-1 positions' KV.

A Talker stage with ``async_chunk`` (top level and stage) keeps its pipeline
stage id and takes its rows from its chunk transfer adapter
(vllm_omni/distributed/omni_connectors/transfer_adapter/chunk_transfer_adapter.py
@0342827dd787296b8a6b1e9f523ebaa24d13c714) instead of the prompt's
``additional_information``; ``request_states`` maps each internal
``{id}-{uuid8}`` to its ``external_request_id`` as upstream's does.
OMNIPD_STANDIN_HOLD_AFTER=N: the hold (OMNIPD_STANDIN_HOLD) comes after a
request's N-th output (default 1).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from vllm.outputs import CompletionOutput
from vllm.sampling_params import SamplingParams

from vllm_omni import _toy
from vllm_omni.outputs import OmniRequestOutput

KV_CONNECTORS = ("NixlConnector", "MooncakeConnector", "P2pNcclConnector", "LMCacheConnectorV1",
                 "MultiConnector", "OffloadingConnector", "MoRIIOConnector", "ExampleConnector")
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")


class _Accumulated:
    """One key's per-step tensors, handed out as the output processor does."""

    def __init__(self) -> None:
        self.pieces: list[list[Any]] = []

    def add(self, rows: list[Any]) -> None:
        self.pieces.append(rows)

    def view(self, finished: bool) -> Any:
        if finished or len(self.pieces) == 1:
            return _toy.Tensor([r for p in self.pieces for r in p])
        return [_toy.Tensor(p) for p in self.pieces]


def _expand(ids: list[int], mm_data: Any) -> tuple[list[int], list[int] | None]:
    """The processor's work on a token prompt: each item's one pad expanded
    into its placeholder count, and each placeholder position's encoder
    feature (0 at text positions); items and pads are matched in order, per
    modality, and must agree in number (vLLM's processor refuses a prompt
    whose placeholders do not match its items too; the words are the
    stand-in's)."""
    if not mm_data:
        return ids, None
    if not isinstance(mm_data, dict):
        raise ValueError("multi_modal_data must be a dict of modality to items")
    queues: dict[int, list[_toy.MediaItem]] = {}
    for modality, items in mm_data.items():
        if modality not in _toy.PADS:
            raise ValueError(f"the stand-in's Thinker takes no {modality!r} items")
        items = items if isinstance(items, list) else [items]
        have = ids.count(_toy.PADS[modality])
        if have != len(items):
            raise ValueError(f"Expected there to be {len(items)} prompt updates corresponding to {len(items)} "
                             f"{modality} items, but instead found {have} prompt updates!")
        queues[_toy.PADS[modality]] = list(items)
    out: list[int] = []
    media: list[int] = []
    for t in ids:
        q = queues.get(t)
        if q is None:
            out.append(t)
            media.append(0)
            continue
        features = q.pop(0).features()
        out.extend([t] * len(features))
        media.extend(features)
    return out, media


class _State:
    def __init__(self, external: str) -> None:
        self.external = external
        self.aborted = False


class AsyncOmni:
    def __init__(self, model: str = "", *args: Any, **kwargs: Any) -> None:
        path = kwargs.get("deploy_config")
        if not path:
            raise ValueError("the stand-in builds from a one-stage deploy_config")
        with open(path) as f:
            cfg = _toy.load_yaml(f.read())
        stages = cfg.get("stages") or []
        if len(stages) != 1:
            raise ValueError(f"the stand-in runs one stage; {path} has {len(stages)}")
        stage = stages[0]
        # Async chunk (a Talker fed by chunks): the stage keeps its pipeline
        # id, so its chunk adapter polls the stage before it (upstream's
        # adapter never polls on stage 0); the top level and the stage's
        # engine arguments both say async_chunk, as vllm-omni's resolver
        # materialises the deploy's value into every stage.
        self.async_chunk = bool(cfg.get("async_chunk")) and bool(stage.get("async_chunk"))
        sid = stage.get("stage_id")
        if sid != 0 and not (self.async_chunk and isinstance(sid, int) and sid > 0):
            raise ValueError(f"the stand-in runs stage 0, or a later stage with async_chunk; {path} has "
                             f"stage_id {sid!r}")
        if stage.get("engine_input_source") or not stage.get("final_output"):
            raise ValueError("a single-stage engine's stage takes no input sources and is final")
        self.stage_config = stage
        self.model = model
        self.model_stage = stage.get("model_stage")
        if self.model_stage not in ("thinker", "talker", "code2wav"):
            raise ValueError(f"model_stage {self.model_stage!r}")
        self.default_sampling_params_list = [SamplingParams(**{k: v for k, v in
                                                               (stage.get("default_sampling_params") or {}).items()
                                                               if k in SamplingParams.__dataclass_fields__})]
        kv = stage.get("kv_transfer_config")
        if isinstance(kv, str):
            kv = json.loads(kv)
        self.kv_role = None
        if kv:
            if kv.get("kv_connector") not in KV_CONNECTORS:
                raise ValueError(f"Unsupported connector type: {kv.get('kv_connector')}")
            if kv.get("kv_role") not in KV_ROLES:
                raise ValueError(f"Unsupported kv_role: {kv.get('kv_role')}")
            self.kv_role = kv["kv_role"]
            self.kv_connector = kv["kv_connector"]
        self.engine_id = str(uuid.uuid4())
        text = SimpleNamespace(vocab_size=_toy.VOCAB_SIZE, num_hidden_layers=_toy.NUM_LAYERS, hidden_size=_toy.WIDTH)
        hf = SimpleNamespace(thinker_config=SimpleNamespace(text_config=text),
                             talker_config=SimpleNamespace(accept_hidden_layer=_toy.ACCEPT_HIDDEN_LAYER),
                             tts_pad_token_id=_toy.TTS_PAD, tts_bos_token_id=_toy.TTS_BOS,
                             tts_eos_token_id=_toy.TTS_EOS)
        # The media flags are the stage's engine arguments, as vllm serve's
        # --allowed-local-media-path / --allowed-media-domains are its
        # ModelConfig's (read by vllm.entrypoints.chat_utils).
        domains = stage.get("allowed_media_domains")
        self.model_config = SimpleNamespace(model=model, max_model_len=int(stage.get("max_model_len") or 4096),
                                            hf_config=hf,
                                            allowed_local_media_path=str(stage.get("allowed_local_media_path") or ""),
                                            allowed_media_domains=(domains.split(",") if isinstance(domains, str)
                                                                   else domains))
        self._tokenizer = _toy.Tokenizer() if self.model_stage == "thinker" else None
        self._states: dict[str, _State] = {}
        # Upstream's per-request client state, keyed by the internal
        # ``{id}-{uuid8}`` id, with the caller's id as external_request_id
        # (vllm_omni/entrypoints/client_request_state.py).
        self.request_states: dict[str, SimpleNamespace] = {}
        self.chunk_transfer_adapter = None
        if self.async_chunk and self.model_stage == "talker":
            from vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter import (  # noqa: PLC0415
                OmniChunkTransferAdapter)
            spec = stage.get("stage_connector_spec") or {}
            self.chunk_transfer_adapter = OmniChunkTransferAdapter(
                {"name": spec.get("name", "SharedMemoryConnector"),
                 "extra": {**(spec.get("extra") or {}), "stage_id": sid}})
        _toy.wait_load_gate()
        _toy.record("loaded", stage=self.model_stage, kv_role=self.kv_role, engine_args=stage)

    @property
    def num_stages(self) -> int:
        return 1

    async def get_tokenizer(self) -> Any:
        return self._tokenizer

    def shutdown(self) -> None:
        _toy.record("shutdown", stage=self.model_stage)

    async def abort(self, request_id: str | Iterable[str], *, timeout: float | None = None) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        found = [s for s in self._states.values() if s.external in ids]
        for s in found:
            s.aborted = True
        for rid in ids:
            _toy.record("abort", request_id=rid, found=any(s.external == rid for s in found))

    async def generate(
        self,
        prompt: Any,
        sampling_params: Any = None,
        request_id: str = "",
        *,
        prompt_text: str | None = None,
        lora_request: Any = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        sampling_params_list: Sequence[Any] | None = None,
        output_modalities: list[str] | None = None,
        trace_headers: Mapping[str, str] | None = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
        reasoning_ended: bool | None = None,
        reasoning_parser_kwargs: dict[str, Any] | None = None,
        arrival_time: float | None = None,
    ) -> AsyncGenerator[OmniRequestOutput, None]:
        if sampling_params_list is None and sampling_params is not None:
            sampling_params_list = [sampling_params]
        sp = (sampling_params_list or self.default_sampling_params_list)[0]
        internal = f"{request_id}-{uuid.uuid4().hex[:8]}"
        state = _State(request_id)
        self._states[internal] = state
        self.request_states[internal] = SimpleNamespace(request_id=internal, external_request_id=request_id)
        hold_at = int(os.environ.get("OMNIPD_STANDIN_HOLD_AFTER") or 1)
        steps = {"thinker": self._thinker, "talker": self._talker, "code2wav": self._code2wav}[self.model_stage]
        reason = "finished"
        try:
            n = 0
            async for out in steps(prompt, sp, internal, request_id):
                if state.aborted:
                    reason = "abort"
                    return
                yield out
                if out.finished:
                    return
                n += 1
                await asyncio.sleep(0)  # as a real engine, other requests run between steps
                # OMNIPD_STANDIN_HOLD_AFTER: the output after which a held
                # request waits (1, the first, unless it says otherwise).
                while n == hold_at and _toy.held() and not state.aborted:
                    await asyncio.sleep(0.01)
                if _toy.failing():
                    raise RuntimeError("the stand-in engine failed (OMNIPD_STANDIN_FAIL)")
                if state.aborted:
                    reason = "abort"
                    return
        except (asyncio.CancelledError, GeneratorExit):
            reason = "client_disconnect"
            raise
        except Exception:
            reason = "error"
            raise
        finally:
            self._states.pop(internal, None)
            self.request_states.pop(internal, None)
            if self.chunk_transfer_adapter is not None:
                self.chunk_transfer_adapter.cleanup(internal)
            _toy.record("released", request_id=request_id, reason=reason, running=len(self._states))

    # ---- the stages ----

    async def _thinker(self, prompt: Any, sp: SamplingParams, internal: str,
                       external: str) -> AsyncGenerator[OmniRequestOutput, None]:
        ids = list(prompt["prompt_token_ids"])
        for t in ids:
            if not 0 <= t < _toy.VOCAB_SIZE:
                raise ValueError(f"Token id {t} is out of vocabulary")
        ids, media = _expand(ids, prompt.get("multi_modal_data"))
        limit = self.model_config.max_model_len
        if len(ids) > limit:
            # vLLM's input processor (vllm/v1/engine/input_processor.py,
            # _validate_model_input) on the processed prompt.
            raise ValueError(f"The decoder prompt (length {len(ids)}) is longer than the maximum model length "
                             f"of {limit}. Make sure that `max_model_len` is no smaller than the number of text "
                             "tokens plus multimodal tokens.")
        max_tokens = sp.max_tokens or (limit - len(ids))
        if media is not None:
            # The server sized max_tokens before the processor expanded the
            # placeholders; the scheduler stops the request at the context
            # length (FINISHED_LENGTH_CAPPED).
            max_tokens = min(max_tokens, limit - len(ids))
        if len(ids) + max_tokens > limit:
            raise ValueError(f"prompt of {len(ids)} tokens and max_tokens {max_tokens} exceed max_model_len "
                             f"{limit}")
        kvp = dict((sp.extra_args or {}).get("kv_transfer_params") or {})
        imported = self.kv_role in ("kv_consumer", "kv_both") and bool(kvp.get("do_remote_prefill"))
        if imported:
            for key, kind in (("remote_block_ids", list), ("remote_engine_id", str), ("remote_host", str),
                              ("remote_port", int)):
                if not isinstance(kvp.get(key), kind):
                    raise ValueError(f"kv_transfer_params.{key} is missing or not a {kind.__name__}")
        export = self.kv_role in ("kv_producer", "kv_both") and bool(kvp.get("do_remote_decode"))
        _toy.record("add", request_id=external, stage="thinker", prompt_len=len(ids), kv_transfer_params=kvp,
                    max_tokens=max_tokens, temperature=sp.temperature, seed=sp.seed)
        tok = self._tokenizer
        states = _toy.prefix_states(ids, media)
        start = len(ids) - 1 if imported else 0
        cached = start
        emb, hid = _Accumulated(), _Accumulated()
        tts = {role: _toy.Tensor([_toy.embedding(t)]) for role, t in
               (("tts_pad", _toy.TTS_PAD), ("tts_bos", _toy.TTS_BOS), ("tts_eos", _toy.TTS_EOS))}
        # A placeholder position's layer-0 row is the encoder's, in place of
        # the pad's word embedding (the Thinker's embed_input_ids).
        emb.add([_toy.media_embedding(media[i]) if media and media[i] else _toy.embedding(ids[i])
                 for i in range(start, len(ids))])
        hid.add([_toy.hidden(states[i], _toy.ACCEPT_HIDDEN_LAYER) for i in range(start, len(ids))])
        generated: list[int] = []
        text = ""
        state = states[-1]
        stops = set(sp.stop_token_ids or [])
        eos = {_toy.IM_END, _toy.ENDOFTEXT}
        step = 0
        while True:
            token = _toy.next_token(state, sp.temperature, sp.seed, step)
            if len(generated) < sp.min_tokens:
                while token in eos or token in stops:
                    token = 32 + (token % 95)
            generated.append(token)
            finish, stop_reason = None, None
            if token in stops:
                finish, stop_reason = "stop", token
            elif token in eos and not sp.ignore_eos:
                finish = "stop"
            new_text = tok.decode(generated, skip_special_tokens=sp.skip_special_tokens)
            for s in sp.stop:
                at = new_text.find(s)
                if at >= 0:
                    new_text, finish, stop_reason = new_text[:at], "stop", s
                    break
            if finish is None and len(generated) >= max_tokens:
                finish = "length"
            done = finish is not None
            if done:
                # The accumulated rows hold one per executed forward, that of
                # the last sampled token too: one more than a Talker consumes
                # (vllm-omni's qwen3_omni.py, thinker2talker_full_payload).
                last = _toy.mix(state ^ (token + 0x1000))
                emb.add([_toy.embedding(token)])
                hid.add([_toy.hidden(last, _toy.ACCEPT_HIDDEN_LAYER)])
            # As vLLM's detokenizer: text that may begin a stop string is held
            # back until it is known not to (stop_buffer_length).
            hold = 0 if done or not sp.stop else max(len(x) for x in sp.stop) - 1
            visible = new_text[:max(len(text), len(new_text) - hold)]
            delta, text = visible[len(text):], visible
            mm = {"hidden_states": {"layers": {0: emb.view(done), _toy.ACCEPT_HIDDEN_LAYER: hid.view(done)}},
                  "embed": tts}
            out = CompletionOutput(index=0, text=delta, token_ids=[token], finish_reason=finish,
                                   stop_reason=stop_reason, multimodal_output=mm,
                                   cumulative_token_ids=list(generated))
            kv_out = None
            if done and export:
                kv_out = {"do_remote_prefill": True, "do_remote_decode": False,
                          "remote_block_ids": list(range((len(ids) + 15) // 16)),
                          "remote_engine_id": self.engine_id,
                          "remote_host": os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost"),
                          "remote_port": int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600")),
                          "remote_request_id": internal, "tp_size": 1}
            if done:
                _toy.record("finish", request_id=external, finish_reason=finish, tokens=generated,
                            cached=cached, kv_transfer_params=kv_out)
            yield OmniRequestOutput(request_id=external, prompt_token_ids=ids, outputs=[out], finished=done,
                                    num_cached_tokens=cached, kv_transfer_params=kv_out, stage_id=0,
                                    final_output_type="text")
            if done:
                return
            # The next step computes the position of the token just sampled.
            state = _toy.mix(state ^ (token + 0x1000))
            emb.add([_toy.embedding(token)])
            hid.add([_toy.hidden(state, _toy.ACCEPT_HIDDEN_LAYER)])
            step += 1

    async def _talker(self, prompt: Any, sp: SamplingParams, internal: str,
                      external: str) -> AsyncGenerator[OmniRequestOutput, None]:
        """The toy Talker on thinker2talker's whole payload (the prompt's
        ``additional_information``), or, on an async-chunk engine, on the
        chunks its adapter receives: the request waits for chunk 0 (the
        prompt's rows and the first reply row), then each step that needs
        a reply row it does not have waits for the next chunk
        (``WAITING_FOR_CHUNK``) until one says ``meta.finished``."""
        plen = len(prompt["prompt_token_ids"])
        info = prompt.get("additional_information")
        chunked = self.chunk_transfer_adapter is not None
        if chunked and info is not None:
            raise ValueError("an async-chunk Talker takes its rows from its input connector, not the prompt")
        if not chunked and not isinstance(info, dict):
            raise ValueError("the Talker's prompt needs additional_information (thinker2talker's payload)")
        state = self._states[internal]
        rows: list[list[float]] = []
        ended = False

        async def next_chunk() -> dict[str, Any] | None:
            """The next chunk once it comes; None when the request was aborted."""
            assert self.chunk_transfer_adapter is not None
            while not state.aborted:
                # The engine request's external_req_id is AsyncOmni's own
                # "{id}-{uuid8}" (async_omni_engine.py sets it so), not the
                # caller's id: the adapter's keys carry that one.
                payload = self.chunk_transfer_adapter.poll(internal, internal)
                if payload is not None:
                    return payload
                await asyncio.sleep(0.002)  # the scheduler's next round
            return None

        def finished(payload: dict[str, Any]) -> bool:
            v = (payload.get("meta") or {}).get("finished")
            return bool(v.item()) if hasattr(v, "item") else bool(v)

        try:
            if chunked:
                head = await next_chunk()
                if head is None:
                    return
                ended = finished(head)
                rows = _toy.as_lists(head["embed"]["prefill"])
                hidden_rows = _toy.as_lists(head["hidden_states"]["output"])
                tts = [_toy.as_lists(head["embed"][k])[-1] for k in ("tts_pad", "tts_bos", "tts_eos")]
                prompt_ids = list(head["ids"]["prompt"])
            else:
                rows = _toy.as_lists(info["embed"]["prefill"])
                hidden_rows = _toy.as_lists(info["hidden_states"]["output"])
                tts = [_toy.as_lists(info["embed"][k])[-1] for k in ("tts_pad", "tts_bos", "tts_eos")]
                prompt_ids = list(info["ids"]["prompt"])
                ended = True
        except (KeyError, TypeError, IndexError) as e:
            raise ValueError(f"the Talker's additional_information lacks {e}") from None
        p = len(prompt_ids)
        if len(rows) < p or len(hidden_rows) < min(len(rows), p + 1):
            raise ValueError(f"the Talker's input has {len(rows)} rows for a {p}-token Thinker prompt")
        _toy.record("add", request_id=external, stage="talker", rows=len(rows), prompt_len=plen, chunked=chunked,
                    temperature=sp.temperature, seed=sp.seed, max_tokens=sp.max_tokens)
        run = _toy.TalkerRun(sp.temperature, sp.seed)
        run.start(rows[:p + 1], hidden_rows[:p + 1], tts, prompt_ids, plen)

        async def reply_row(i: int) -> list[float] | None:
            """Row i of the conditioning, waiting for chunks while none says
            it was the last; None when the conditioning ends before it."""
            nonlocal ended
            while i >= len(rows) and not ended:
                payload = await next_chunk()
                if payload is None:
                    return None
                ended = finished(payload)
                decode = (payload.get("embed") or {}).get("decode")
                if decode is not None:
                    rows.extend(_toy.as_lists(decode))
            return rows[i] if i < len(rows) else None

        stops = set(sp.stop_token_ids or [])
        codes = _Accumulated()
        codes.add([[0] * _toy.CODEBOOKS for _ in range(plen)])
        sampled: list[int] = []
        frame: list[int] | None = None
        while True:
            if sampled:
                # This step consumes the last code: its input adds the next
                # reply row, and its forward completes that code's frame.
                row = await reply_row(p + len(sampled))
                if state.aborted:
                    return
                run.advance(sampled[-1], row)
                assert frame is not None
                codes.add([frame])
            c = run.code()
            frame = run.frame(c)
            sampled.append(c)
            finish = "stop" if c in stops else ("length" if len(sampled) >= (sp.max_tokens or 4096) else None)
            done = finish is not None
            out = CompletionOutput(index=0, text="", token_ids=[c], finish_reason=finish,
                                   stop_reason=c if finish == "stop" else None,
                                   multimodal_output={"codes": {"audio": codes.view(done)}},
                                   cumulative_token_ids=list(sampled))
            if done:
                _toy.record("finish", request_id=external, finish_reason=finish, frames=len(sampled) - 1)
            yield OmniRequestOutput(request_id=external, prompt_token_ids=list(prompt["prompt_token_ids"]),
                                    outputs=[out], finished=done, num_cached_tokens=0, stage_id=0,
                                    final_output_type="latent")
            if done:
                return

    async def _code2wav(self, prompt: Any, sp: SamplingParams, internal: str,
                        external: str) -> AsyncGenerator[OmniRequestOutput, None]:
        codes = list(prompt["prompt_token_ids"])
        if len(codes) % _toy.CODEBOOKS:
            raise ValueError(f"{len(codes)} codes are not whole frames of {_toy.CODEBOOKS}")
        n = len(codes) // _toy.CODEBOOKS
        _toy.record("add", request_id=external, stage="code2wav", frames=n)
        frames = [[codes[q * n + t] for q in range(_toy.CODEBOOKS)] for t in range(n)]
        samples: list[float] = []
        for t, f in enumerate(frames):
            samples.extend(_toy.frame_samples(f, frames[t - 1] if t else None))
        out = CompletionOutput(index=0, text="", token_ids=[], finish_reason="stop",
                               multimodal_output={"audio": _toy.Tensor([samples]), "sr": _toy.SAMPLE_RATE})
        _toy.record("finish", request_id=external, finish_reason="stop", samples=len(samples))
        yield OmniRequestOutput(request_id=external, prompt_token_ids=codes, outputs=[out], finished=True,
                                num_cached_tokens=0, stage_id=0, final_output_type="audio")


_toy.drop_interfaces(globals(), __name__)
