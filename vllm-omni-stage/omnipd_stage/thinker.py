"""A Thinker stage: vLLM's OpenAI endpoints on a single-stage vllm-omni
Thinker engine, plus omnipd's conditioning stash.

Requests go to ``AsyncOmni.generate(prompt, sampling_params, request_id)``
(vllm_omni/entrypoints/async_omni.py, v0.32.0) with a token prompt the
worker rendered and tokenized itself — with ``multi_modal_data`` for a chat
with media (omnipd_stage/media.py) — in DELTA output mode; each yielded
``OmniRequestOutput`` (vllm_omni/outputs.py) is a vLLM ``RequestOutput``:
``outputs[0].text`` / ``.token_ids`` are the step's delta,
``outputs[0].multimodal_output`` the Thinker's captured layers
(``hidden_states.layers[0]`` the word embeddings, ``[accept_hidden_layer]``
the hidden states, cumulative over the request) and TTS embeddings
(``embed.tts_pad`` / ``tts_bos`` / ``tts_eos``), ``num_cached_tokens`` and
``kv_transfer_params`` as vLLM sets them. Those keys are the ones
vllm-omni's Thinker→Talker processor reads (thinker2talker in
vllm_omni/model_executor/stage_input_processors/qwen3_omni.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from . import media, tensors
from .errors import APIError, invalid, model_not_found
from .httpserver import ClientGone, Conn, Request, Response, json_response
from .params import DEFAULT_COMPLETION_MAX_TOKENS, Generation, read_generation, read_messages
from .stash import Exists, Stash, Store

log = logging.getLogger("omnipd_stage.thinker")

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"

# The stage's default_sampling_params (the deploy config's) fill what a
# request leaves out, as vLLM's generation-config defaults do
# (vllm/entrypoints/openai/serving_engine.py, default_sampling_params).
_DEFAULTABLE = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                "frequency_penalty", "seed", "stop", "stop_token_ids", "ignore_eos", "min_tokens",
                "skip_special_tokens")


def _layer(layers: Any, index: int) -> Any:
    if not isinstance(layers, dict):
        return None
    v = layers.get(index)
    return v if v is not None else layers.get(str(index))


def captured(mm: Any, layer: int) -> tuple[Any, Any, dict[str, Any]]:
    """(layer-0 rows, layer rows, TTS embeddings by role) from a Thinker
    output's multimodal_output, in the nested shape the output processor
    hands out, or the flat keys it is built from ("hidden_states.layer_0",
    "embed.tts_pad"; vllm_omni/engine/output_processor.py unflattens them)."""
    if mm is None:
        return None, None, {}
    get = mm.get if hasattr(mm, "get") else (lambda k, d=None: getattr(mm, k, d))
    hs = get("hidden_states") or {}
    layers = hs.get("layers") if isinstance(hs, dict) else None
    emb, hid = _layer(layers, 0), _layer(layers, layer)
    if emb is None:
        emb = get(f"hidden_states.layer_0")
    if hid is None:
        hid = get(f"hidden_states.layer_{layer}")
    embed = get("embed") or {}
    tts = {}
    for role in ("tts_pad", "tts_bos", "tts_eos"):
        v = embed.get(role) if isinstance(embed, dict) else None
        if v is None:
            v = get(f"embed.{role}")
        if v is None:
            v = get(f"{role}_embed")  # vllm-omni before the nested payload
        tts[role] = v
    return emb, hid, tts


class ConditioningSink:
    """Where one request's rows go: a stash put when the request finishes
    (batch), or one that grows step by step (async chunk)."""

    def __init__(self, store: Store, key: str, layer: int, prompt: list[int] | None, stream: bool, rid: str) -> None:
        self.store, self.key, self.layer, self.stream, self.rid = store, key, layer, stream, rid
        # A prompt with media is known once the engine's processor has
        # expanded it (set_prompt, before any row): until then a streamed
        # stash reads with no prompt ids.
        self.stash = Stash(token_ids=list(prompt or []), prompt_token_ids=list(prompt or []))
        self.gone = False
        self.first_position: int | None = None

    def set_prompt(self, prompt: list[int]) -> None:
        """The prompt as the engine computed it; the stash's lists are the
        ones its readers see."""
        self.stash.token_ids[:0] = prompt
        self.stash.prompt_token_ids[:] = prompt

    def open(self) -> None:
        if not self.stream:
            return
        try:
            if not self.store.open(self.key, self.stash):
                log.debug("conditioning %s released before it was kept", self.key, extra={"request_id": self.rid})
                self.gone = True
        except Exists as e:
            raise invalid("omnipd_conditioning", str(e)) from None
        except ValueError as e:
            raise invalid("omnipd_conditioning", str(e)) from None

    def add(self, mm: Any, new_tokens: list[int], cap: int) -> None:
        """Takes the rows of one output beyond those already kept, up to cap
        rows in all (the positions whose next token exists), with the tokens
        the step brought."""
        if self.gone:
            return
        emb, hid, tts = captured(mm, self.layer)
        if emb is None or hid is None:
            if new_tokens and self.stream:
                self.store.append(self.key, 0, 0, b"", 0, b"", new_tokens)
            elif new_tokens:
                self.stash.token_ids.extend(new_tokens)
            return
        if not self.stash.tts_width and tts.get("tts_pad") is not None:
            parts = [tensors.vector(tts[r]) for r in ("tts_pad", "tts_bos", "tts_eos")]
            if tts.get("tts_bos") is None or tts.get("tts_eos") is None or len({w for w, _ in parts}) != 1:
                raise APIError(500, "the engine's TTS embeddings are missing or differ in width", type_="server_error")
            self.stash.tts_width = parts[0][0]
            self.stash.tts = b"".join(b for _, b in parts)
        have = self.stash.rows
        n_e, w_e, b_e = tensors.rows(emb)
        n_h, w_h, b_h = tensors.rows(hid)
        if n_e != n_h:
            raise APIError(500, f"the engine captured {n_e} embedding rows but {n_h} hidden rows",
                           type_="server_error")
        upto = min(n_e, cap)
        if upto > have:
            k = upto - have
            e_bytes = b_e[4 * have * w_e:4 * upto * w_e]
            h_bytes = b_h[4 * have * w_h:4 * upto * w_h]
            if self.stream:
                if not self.store.append(self.key, k, w_e, e_bytes, w_h, h_bytes, new_tokens):
                    self.gone = True
                return
            self.stash.add_rows(k, w_e, e_bytes, w_h, h_bytes)
        if self.stream:
            if new_tokens and not self.store.append(self.key, 0, 0, b"", 0, b"", new_tokens):
                self.gone = True
        else:
            self.stash.token_ids.extend(new_tokens)

    def finish(self) -> dict[str, Any] | None:
        """Closes or puts the stash; the handle for the response."""
        if self.gone:
            return None
        if self.stream:
            self.store.close(self.key)
            return {"key": self.key, "rows": self.stash.rows}
        try:
            if not self.store.put(self.key, self.stash):
                return None
        except (Exists, ValueError) as e:
            raise invalid("omnipd_conditioning", str(e)) from None
        return {"key": self.key, "rows": self.stash.rows}

    def fail(self, cause: str) -> None:
        if self.stream and not self.gone:
            self.store.fail(self.key, cause)
        self.gone = True


class Thinker:
    """The Thinker's OpenAI endpoints over one engine."""

    def __init__(self, worker: Any) -> None:
        self.w = worker

    # ---- helpers ----

    @property
    def engine(self) -> Any:
        return self.w.engine

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.w.served_name:
            raise model_not_found(model)

    def _too_long(self, chat: bool, tokens: int | str) -> APIError:
        # vLLM's wording (vllm/entrypoints/openai/serving_engine.py, _validate_input).
        return invalid("messages" if chat else "prompt",
                       f"This model's maximum context length is {self.w.facts.max_model_len} tokens. However, your "
                       f"request has {tokens} input tokens. Please reduce the length of the input messages.",
                       CONTEXT_LENGTH_EXCEEDED)

    def render(self, g: Generation) -> list[int]:
        """The prompt's token ids: the chat template rendered and tokenized,
        a text tokenized, or the ids given."""
        tok = self.w.tokenizer
        if g.chat:
            text = tok.apply_chat_template(g.messages, tokenize=False, add_generation_prompt=g.add_generation_prompt,
                                           **g.chat_template_kwargs)
            ids = list(tok.encode(text, add_special_tokens=False))
        elif g.prompt_text is not None:
            ids = list(tok.encode(g.prompt_text))
        else:
            ids = list(g.prompt_ids or [])
            vocab = max(self.w.facts.vocab_size, len(tok))
            for t in ids:
                if t >= vocab:
                    raise invalid("prompt", f"Token id {t} is out of vocabulary")
        if not ids:
            raise invalid("messages" if g.chat else "prompt", "the prompt is empty")
        return ids

    def sampling_params(self, g: Generation, prompt_len: int) -> Any:
        from vllm.sampling_params import RequestOutputKind, SamplingParams  # noqa: PLC0415

        limit = self.w.facts.max_model_len
        if prompt_len >= limit:
            raise self._too_long(g.chat, prompt_len)
        max_tokens = g.max_tokens
        if max_tokens is None and not g.chat:
            max_tokens = DEFAULT_COMPLETION_MAX_TOKENS  # vLLM's CompletionRequest default
        elif max_tokens is None:
            # vLLM's get_max_tokens: the default max_tokens (here the stage's
            # default_sampling_params), capped by what the context leaves.
            default = self.w.spec.default_sampling_params.get("max_tokens")
            max_tokens = limit - prompt_len
            if isinstance(default, int) and default > 0:
                max_tokens = min(max_tokens, default)
        if prompt_len + max_tokens > limit:
            raise invalid("messages" if g.chat else "prompt",
                          f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                          f"context length is {limit} tokens and your request has {prompt_len} input tokens "
                          f"({max_tokens} > {limit} - {prompt_len}).", CONTEXT_LENGTH_EXCEEDED)
        extra = {"kv_transfer_params": g.kv_transfer_params} if g.kv_transfer_params else None
        fields = {k: v for k, v in self.w.spec.default_sampling_params.items() if k in _DEFAULTABLE}
        fields.update(g.sampling)
        try:
            return SamplingParams(n=1, max_tokens=max_tokens, output_kind=RequestOutputKind.DELTA,
                                  extra_args=extra, **fields)
        except (ValueError, TypeError) as e:  # vLLM's own validation of the values
            raise invalid(None, str(e)) from None

    # ---- endpoints ----

    async def completions(self, req: Request, conn: Conn) -> Response | None:
        return await self._generate(req, conn, chat=False)

    async def chat(self, req: Request, conn: Conn) -> Response | None:
        return await self._generate(req, conn, chat=True)

    async def _generate(self, req: Request, conn: Conn, chat: bool) -> Response | None:
        body = req.json_object()
        default_layer = self.w.conditioning_layer
        g = read_generation(body, chat, default_layer)
        self._check_model(g.model)
        if g.media_parts:
            ids, prompt = await media.engine_prompt(self.engine, self.w.tokenizer, g)
        else:
            ids = self.render(g)
            prompt = {"prompt_token_ids": ids}
        # With media the count is before the processor's expansion, as vLLM's
        # server sizes max_tokens; the engine caps the rest at the context.
        sp = self.sampling_params(g, len(ids))
        sink = None
        if g.conditioning is not None:
            self._check_conditioning(g.conditioning.layer)
            sink = ConditioningSink(self.w.stash, g.conditioning.key, g.conditioning.layer,
                                    None if g.media_parts else ids, g.conditioning.stream, req.request_id)
            sink.open()
        run = _Run(self, req, conn, g, ids, sp, sink, prompt)
        return await run.go()

    def _check_conditioning(self, layer: int) -> None:
        facts = self.w.facts
        if facts.tts_token_ids is None:
            raise invalid("omnipd_conditioning", "this model has no TTS tokens (tts_pad_token_id, tts_bos_token_id, "
                                                 "tts_eos_token_id in its config), whose embeddings a Talker needs "
                                                 "with the rows; serve an omni Thinker")
        if facts.accept_hidden_layer is not None and layer != facts.accept_hidden_layer:
            raise invalid("omnipd_conditioning",
                          f"this engine captures the hidden states of layer {facts.accept_hidden_layer} only (the "
                          f"Talker's accept_hidden_layer); ask for layer {facts.accept_hidden_layer}")

    async def tokenize(self, req: Request, conn: Conn) -> Response:
        body = req.json_object()
        model = body.get("model")
        if model is not None:
            self._check_model(model)
        if "messages" in body:
            g = Generation(chat=True, model=None)
            read_messages(body, g)
            if g.media_parts:
                # The placeholder counts are the engine's processor's, known
                # only once it runs; a completion's usage.prompt_tokens counts
                # them.
                raise invalid(g.media_parts[0], "/tokenize counts no media placeholders in this worker; a chat "
                                                "completion's usage.prompt_tokens counts the expanded prompt")
            ids = self.render(g)
            chat = True
        elif isinstance(body.get("prompt"), str):
            ids = list(self.w.tokenizer.encode(body["prompt"], add_special_tokens=body.get("add_special_tokens", True)))
            chat = False
        else:
            raise invalid("prompt", "give a prompt (a string) or messages")
        if len(ids) > self.w.facts.max_model_len:
            raise self._too_long(chat, len(ids))
        return json_response({"count": len(ids), "max_model_len": self.w.facts.max_model_len, "tokens": ids})

    async def detokenize(self, req: Request, conn: Conn) -> Response:
        body = req.json_object()
        model = body.get("model")
        if model is not None:
            self._check_model(model)
        toks = body.get("tokens")
        if not isinstance(toks, list):
            raise invalid("tokens", "tokens must be a list of token ids")
        if len(toks) > self.w.facts.max_model_len:
            raise invalid("tokens", f"This model's maximum context length is {self.w.facts.max_model_len} tokens. "
                                    f"However, your request has {len(toks)} input tokens. Please reduce the length "
                                    "of the input messages.", CONTEXT_LENGTH_EXCEEDED)
        vocab = max(self.w.facts.vocab_size, len(self.w.tokenizer))
        for i, t in enumerate(toks):
            if isinstance(t, bool) or not isinstance(t, int):
                raise invalid(f"tokens[{i}]", f"tokens[{i}] must be an integer token id")
            if t < 0 or t >= vocab:
                # vLLM's words (vllm/v1/engine/input_processor.py).
                raise invalid("tokens", f"Token id {t} is out of vocabulary")
        return json_response({"prompt": self.w.tokenizer.decode(toks, skip_special_tokens=False)})


class _Run:
    """One engine request and its answer."""

    def __init__(self, t: Thinker, req: Request, conn: Conn, g: Generation, ids: list[int], sp: Any,
                 sink: ConditioningSink | None, prompt: dict[str, Any]) -> None:
        self.t, self.req, self.conn, self.g, self.ids, self.sp, self.sink = t, req, conn, g, ids, sp, sink
        self.prompt = prompt
        # With media, ids become the engine's processed prompt at its first
        # output: usage, the rows' bound and the stash count the placeholders.
        self.expanded = not g.media_parts
        self.rid = req.request_id
        self.created = int(time.time())
        self.text: list[str] = []
        self.tokens: list[int] = []
        self.cached = 0
        self.kv_params: Any = None
        self.finish_reason: str | None = None
        self.stop_reason: Any = None
        self.started_stream = False

    def _id(self) -> str:
        return ("chatcmpl-" if self.g.chat else "cmpl-") + self.rid

    async def go(self) -> Response | None:
        outputs = self.t.w.outputs(self.prompt, self.sp, self.rid)
        try:
            try:
                async for out in outputs:
                    if await self._step(out):
                        break
            except (APIError, ClientGone, asyncio.CancelledError):
                raise
            except Exception as e:
                # The engine's refusal of the request itself (vLLM's input
                # processor raises ValueError, or VLLMValidationError since
                # 0.29) is the client's 400.
                status = media.client_status(e)
                if status is None or self.tokens or self.started_stream:
                    raise
                raise APIError(status, str(e), param="messages" if self.g.media_parts else None) from None
        except BaseException as e:
            if self.sink is not None:
                self.sink.fail("the request was cancelled" if isinstance(e, asyncio.CancelledError)
                               else f"{type(e).__name__}: {e}")
            if self.started_stream and isinstance(e, Exception) and not isinstance(e, ClientGone):
                log.error("request failed mid-stream: %s", e, extra={"request_id": self.rid})
                await self._send_error(e)
                return None
            raise
        finally:
            await outputs.aclose()
        return await self._finish()

    async def _step(self, out: Any) -> bool:
        if not self.expanded:
            self.expanded = True
            processed = getattr(out, "prompt_token_ids", None)
            if processed:
                self.ids = list(processed)
            if self.sink is not None:
                self.sink.set_prompt(self.ids)
        o = out.outputs[0] if out.outputs else None
        if getattr(out, "num_cached_tokens", None) is not None:
            self.cached = int(out.num_cached_tokens or 0)
        new_tokens = list(o.token_ids) if o is not None else []
        self.tokens.extend(new_tokens)
        delta = (o.text or "") if o is not None else ""
        if self.sink is not None:
            mm = getattr(o, "multimodal_output", None) if o is not None else None
            if mm is None:
                mm = getattr(out, "multimodal_output", None)
            if self.cached and not self._imported() and self.sink.stash.rows == 0:
                raise APIError(500, f"the engine served {self.cached} prompt positions from its prefix cache and "
                                    "computed no conditioning rows for them; serve the Thinker with "
                                    "enable_prefix_caching: false", type_="server_error")
            cap = len(self.ids) + len(self.tokens) - 1 - self.cached
            self.sink.add(mm, new_tokens, cap)
        finished = bool(out.finished)
        if finished:
            self.finish_reason = getattr(o, "finish_reason", None) or "stop"
            self.stop_reason = getattr(o, "stop_reason", None)
            self.kv_params = getattr(out, "kv_transfer_params", None)
        if self.g.stream:
            if not self.started_stream:
                await self.conn.start_stream()
                self.started_stream = True
                if self.g.chat:
                    await self.conn.send_event(self._chunk("", None, role=True))
            if delta and not finished:
                await self.conn.send_event(self._chunk(delta, None))
            elif finished:
                await self.conn.send_event(self._chunk(delta, self.finish_reason))
        else:
            self.text.append(delta)
        return finished

    def _imported(self) -> bool:
        p = self.g.kv_transfer_params or {}
        return bool(p.get("do_remote_prefill"))

    def _usage(self) -> dict[str, Any]:
        return {"prompt_tokens": len(self.ids), "total_tokens": len(self.ids) + len(self.tokens),
                "completion_tokens": len(self.tokens), "prompt_tokens_details": {"cached_tokens": self.cached}}

    def _chunk(self, text: str, finish: str | None, role: bool = False) -> dict[str, Any]:
        w = self.t.w
        if self.g.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": text}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            if finish is not None:
                choice["stop_reason"] = self.stop_reason
            return {"id": self._id(), "object": "chat.completion.chunk", "created": self.created, "model": w.served_name,
                    "choices": [choice], "usage": None}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = self.stop_reason
        return {"id": self._id(), "object": "text_completion", "created": self.created, "model": w.served_name,
                "choices": [choice], "usage": None}

    async def _send_error(self, e: Exception) -> None:
        """vLLM's mid-stream error: an ``{"error": {...}}`` event, then
        ``[DONE]``."""
        msg = e.message if isinstance(e, APIError) else str(e)
        try:
            await self.conn.send_event({"error": {"message": msg, "type": "server_error", "param": None,
                                                  "code": None}})
            await self.conn.send_event("[DONE]")
        except ClientGone:
            pass

    async def _finish(self) -> Response | None:
        w = self.t.w
        handle = self.sink.finish() if self.sink is not None else None
        if self.g.stream:
            if not self.started_stream:  # an engine that yielded nothing
                await self.conn.start_stream()
            if self.g.include_usage:
                ch = self._chunk("", None)
                ch["choices"] = []
                ch["usage"] = self._usage()
                await self.conn.send_event(ch)
            await self.conn.send_event("[DONE]")
            return None
        text = "".join(self.text)
        if self.g.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text,
                                                              "tool_calls": []},
                                      "logprobs": None, "finish_reason": self.finish_reason,
                                      "stop_reason": self.stop_reason}
            body: dict[str, Any] = {"id": self._id(), "object": "chat.completion", "created": self.created,
                                    "model": w.served_name, "choices": [choice]}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.finish_reason,
                      "stop_reason": self.stop_reason, "prompt_logprobs": None}
            body = {"id": self._id(), "object": "text_completion", "created": self.created, "model": w.served_name,
                    "choices": [choice]}
        if self.g.return_token_ids:
            choice["token_ids"] = self.tokens
        body["usage"] = self._usage()
        body["kv_transfer_params"] = self.kv_params
        if handle is not None:
            body["omnipd_conditioning"] = handle
        return json_response(body)
