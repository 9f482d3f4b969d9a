"""A Talker stage: omnipd's ``POST /v1/omnipd/talker`` on a single-stage
vllm-omni Talker engine.

1. Fetch each handle's stash from its Thinker worker, with the deployment
   secret: whole (``GET``), or with ``async_chunk`` streamed (``?from=N``:
   the prefill's to its end, then the decode's from row 1; colocated the one
   stash from row 0). Merge a prefill/decode pair as ``prefill[0:P] ++
   decode[1:]``.
2. Build the Talker's prompt with vllm-omni's own processor,
   ``thinker2talker(source_outputs, prompt, requires_multimodal_data,
   streaming_context)`` (vllm_omni/model_executor/stage_input_processors/
   qwen3_omni.py), given one source output made from the rows: the Thinker
   output it reads (``prompt_token_ids``, ``outputs[0].cumulative_token_ids``,
   ``outputs[0].multimodal_output`` with ``hidden_states.layers[0]`` and
   ``[accept_hidden_layer]`` and ``embed.tts_*``). Its PD merge is not used:
   the rows come merged, without the duplicate row.
3. Run it (``AsyncOmni.generate``), the way Dynamo's stage worker runs a
   downstream stage on the processor's prompt
   (components/src/dynamo/vllm/omni/stage_worker.py, ``generate``), and
   stream one SSE event per codec frame: the frame of each decode step is
   the row of ``multimodal_output["codes"]["audio"]`` (zero rows for the
   prefill positions first), its codebook 0 the token the step consumed.

On a Talker engine built with ``async_chunk`` (engine.streams_talker) the
engine request instead starts on a placeholder prompt once the prompt's rows
and the first reply row are in, and takes every row through its chunk
transfer adapter as the Thinker makes it: the worker writes the chunks
(talker_feed.py) while it streams the frames. A request with
``async_chunk`` reads the stashes as they grow; one without takes them
whole and puts every chunk at once. The frames are the same either way.
Without an ``async_chunk`` engine, a request with ``async_chunk`` reads the
rows as the Thinker makes them but starts the engine request once the
whole conditioning is in (the prompt thinker2talker builds).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from types import SimpleNamespace
from collections.abc import AsyncIterator
from typing import Any

from . import client, talker_feed, tensors
from .engine import streams_talker
from .errors import APIError, invalid
from .httpserver import ClientGone, Conn, Request, Response
from .stash import Stash

log = logging.getLogger("omnipd_stage.talker")

CODEBOOKS = 16
CODEBOOK_SIZE = 2048
CODEC_STOP = 2150  # Qwen3-Omni's codec stop token (the Talker stage's stop_token_ids)
# The most frames one request may ask for, as omnipd's reference Talker
# bounds it: 65536 frames are 87 minutes of speech at 12.5 frames/s.
MAX_FRAMES = 65536


def _handles(body: dict[str, Any]) -> list[tuple[str, str]]:
    hs = body.get("conditioning")
    want = "give one handle (a colocated Thinker) or two (the prefill's, then the decode's), each {\"url\", \"key\"}"
    if not isinstance(hs, list) or len(hs) not in (1, 2):
        raise invalid("conditioning", want)
    out = []
    for i, h in enumerate(hs):
        if not isinstance(h, dict) or not isinstance(h.get("url"), str) or not h["url"].startswith("http://") \
                or not isinstance(h.get("key"), str) or not h["key"]:
            raise invalid(f"conditioning[{i}]", want)
        out.append((h["url"], h["key"]))
    return out


def merge(prefill: Stash, decode: Stash) -> Stash:
    """The colocated-equivalent conditioning of a PD pair: the prefill's rows
    for the prompt's P positions, then the decode's after its first, which
    recomputes the prompt's last position (omnipd's stageapi.MergeConditioning)."""
    p = len(prefill.prompt_token_ids)
    if p == 0:
        raise APIError(502, "the prefill stash has no prompt", type_="upstream_error")
    if prefill.rows < p:
        raise APIError(502, f"the prefill stash has {prefill.rows} rows for a {p}-token prompt", type_="upstream_error")
    if decode.rows == 0:
        raise APIError(502, "the decode stash has no rows; want at least the recomputed last prompt position",
                       type_="upstream_error")
    out = Stash(token_ids=decode.token_ids or prefill.token_ids, prompt_token_ids=prefill.prompt_token_ids)
    out.add_rows(p, prefill.embed_width, bytes(prefill.embed[:4 * p * prefill.embed_width]), prefill.hidden_width,
                 bytes(prefill.hidden[:4 * p * prefill.hidden_width]))
    out.add_rows(decode.rows - 1, decode.embed_width, bytes(decode.embed[4 * decode.embed_width:]),
                 decode.hidden_width, bytes(decode.hidden[4 * decode.hidden_width:]))
    src = decode if decode.tts_width else prefill
    out.tts_width, out.tts = src.tts_width, src.tts
    return out


class Talker:
    def __init__(self, worker: Any) -> None:
        self.w = worker
        self._releases: set[asyncio.Task[None]] = set()
        self._fed: set[str] = set()  # the engine ids of the requests being fed

    async def generate(self, req: Request, conn: Conn) -> Response | None:
        body = req.json_object()
        handles = _handles(body)
        sp = self._sampling(body)
        max_frames = sp.max_tokens - 1
        done = [False] * len(handles)
        if streams_talker(self.w.spec):
            return await self._generate_fed(req, conn, body, handles, sp, max_frames)
        try:
            # From here on, whatever is not read to its end is released, even
            # when the request ends (or its client leaves) before any read.
            if body.get("async_chunk"):
                st = await self._read_streamed(handles, done)
            else:
                st = await self._take(handles, done)
        except client.FetchError as e:
            raise APIError(e.status, str(e), type_="upstream_error", code="conditioning_unavailable") from None
        finally:
            self._release(handles, done)
        prompt = self._prompt(st, req.request_id)
        await conn.start_stream()
        frames = 0
        gen = self._frames(prompt, sp, req.request_id, max_frames)
        try:
            async for frame in gen:
                await conn.send_event({"frame": frame})
                frames += 1
                self.w.metrics.record_frames(1)
        except (ClientGone, asyncio.CancelledError):
            raise
        except Exception as e:  # the stream has begun: its error is an event, then [DONE]
            msg = e.message if isinstance(e, APIError) else f"{type(e).__name__}: {e}"
            log.error("talker generation failed: %s", msg, extra={"request_id": req.request_id})
            await conn.send_event({"error": msg})
            await conn.send_event("[DONE]")
            return None
        finally:
            await gen.aclose()
        await conn.send_event({"done": True, "frames": frames})
        await conn.send_event("[DONE]")
        return None

    def _sampling(self, body: dict[str, Any]) -> Any:
        from vllm.sampling_params import RequestOutputKind, SamplingParams  # noqa: PLC0415

        d = self.w.spec.default_sampling_params
        temperature = body.get("temperature", d.get("temperature", 0.9))
        if (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                or not math.isfinite(temperature) or temperature < 0):
            raise invalid("temperature", "temperature must be a finite number >= 0")
        top_k = body.get("top_k", d.get("top_k", -1))
        if top_k is None:
            top_k = -1
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < -1:
            raise invalid("top_k", "top_k must be an integer: -1 or 0 (off), or at least 1")
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                                 or not -(1 << 63) <= seed < (1 << 63)):
            raise invalid("seed", "seed must be a 64-bit integer or null")
        max_frames = body.get("max_frames") or d.get("max_tokens", 4096)
        if (isinstance(max_frames, bool) or not isinstance(max_frames, int)
                or not 1 <= max_frames <= MAX_FRAMES):
            raise invalid("max_frames", f"max_frames must be an integer from 1 to {MAX_FRAMES}")
        stops = sorted({CODEC_STOP, *(d.get("stop_token_ids") or [])})
        extra = {k: d[k] for k in ("repetition_penalty",) if k in d}
        # The last sampled token's frame is never computed (no step consumes
        # it): max_frames frames need max_frames + 1 tokens.
        return SamplingParams(n=1, temperature=float(temperature), top_k=top_k, seed=seed,
                              max_tokens=max_frames + 1, stop_token_ids=stops, detokenize=False,
                              output_kind=RequestOutputKind.DELTA, **extra)

    # ---- the conditioning ----

    async def _take(self, handles: list[tuple[str, str]], done: list[bool]) -> Stash:
        results = await asyncio.gather(*(client.take(u, k, self.w.secret) for u, k in handles),
                                       return_exceptions=True)
        for i, r in enumerate(results):
            if not isinstance(r, BaseException) or isinstance(r, client.FetchError):
                done[i] = True  # taken, or not there: nothing left to release
        for r in results:
            if isinstance(r, BaseException):
                raise r
        stashes = [r for r in results if isinstance(r, Stash)]
        return stashes[0] if len(stashes) == 1 else merge(stashes[0], stashes[1])

    async def _read_all(self, handle: tuple[str, str], start: int, i: int, done: list[bool]) -> Stash:
        """Reads one growing stash from row start to its end. An empty answer
        (the Thinker's bounded wait ran out) is asked again."""
        url, key = handle
        acc = Stash()
        n = start
        while True:
            t0 = time.monotonic()
            st, end, waited = await client.read_from(url, key, self.w.secret, n)
            self.w.metrics.record_conditioning_read(st.rows, waited, time.monotonic() - t0)
            acc.add_rows(st.rows, st.embed_width, bytes(st.embed), st.hidden_width, bytes(st.hidden))
            if st.rows or end:  # an empty answer after a wait carries nothing else either
                acc.token_ids = st.token_ids or acc.token_ids
                acc.prompt_token_ids = st.prompt_token_ids or acc.prompt_token_ids
                if st.tts_width:
                    acc.tts_width, acc.tts = st.tts_width, st.tts
            n += st.rows
            if end:
                done[i] = True
                return acc

    async def _read_streamed(self, handles: list[tuple[str, str]], done: list[bool]) -> Stash:
        if len(handles) == 1:
            return await self._read_all(handles[0], 0, 0, done)
        pre = await self._read_all(handles[0], 0, 0, done)
        p = len(pre.prompt_token_ids)
        if p == 0 or pre.rows < p:
            raise APIError(502, f"the prefill stash has {pre.rows} rows for a {p}-token prompt",
                           type_="upstream_error")
        # The decode's row 0 recomputes the prompt's last position: read past it.
        dec = await self._read_all(handles[1], 1, 1, done)
        out = Stash(token_ids=dec.token_ids or pre.token_ids, prompt_token_ids=pre.prompt_token_ids)
        out.add_rows(p, pre.embed_width, bytes(pre.embed[:4 * p * pre.embed_width]), pre.hidden_width,
                     bytes(pre.hidden[:4 * p * pre.hidden_width]))
        out.add_rows(dec.rows, dec.embed_width, bytes(dec.embed), dec.hidden_width, bytes(dec.hidden))
        src = dec if dec.tts_width else pre
        out.tts_width, out.tts = src.tts_width, src.tts
        return out

    async def _batches(self, handles: list[tuple[str, str]], done: list[bool],
                       streamed: bool) -> AsyncIterator[tuple[Stash, bool]]:
        """The merged conditioning in the batches it comes in, each with
        whether it is the last: whole (one batch), or as the stashes grow —
        the prefill's rows [0:P] once it ended, then the decode's from row 1
        (colocated, the one stash from row 0) read by read."""
        if not streamed:
            yield await self._take(handles, done), True
            return
        i = start = 0
        if len(handles) == 2:
            pre = await self._read_all(handles[0], 0, 0, done)
            p = len(pre.prompt_token_ids)
            if p == 0 or pre.rows < p:
                raise APIError(502, f"the prefill stash has {pre.rows} rows for a {p}-token prompt",
                               type_="upstream_error")
            head = Stash(token_ids=pre.token_ids, prompt_token_ids=pre.prompt_token_ids)
            head.add_rows(p, pre.embed_width, bytes(pre.embed[:4 * p * pre.embed_width]), pre.hidden_width,
                          bytes(pre.hidden[:4 * p * pre.hidden_width]))
            head.tts_width, head.tts = pre.tts_width, pre.tts
            yield head, False
            i = start = 1  # the decode's row 0 recomputes the prompt's last position
        url, key = handles[i]
        n = start
        while True:
            t0 = time.monotonic()
            st, end, waited = await client.read_from(url, key, self.w.secret, n)
            self.w.metrics.record_conditioning_read(st.rows, waited, time.monotonic() - t0)
            if end:
                done[i] = True
            n += st.rows
            if st.rows or end:
                yield st, end
            if end:
                return

    @staticmethod
    def _absorb(acc: Stash, st: Stash) -> None:
        acc.add_rows(st.rows, st.embed_width, bytes(st.embed), st.hidden_width, bytes(st.hidden))
        acc.token_ids = st.token_ids or acc.token_ids
        acc.prompt_token_ids = acc.prompt_token_ids or st.prompt_token_ids
        if st.tts_width and not acc.tts_width:
            acc.tts_width, acc.tts = st.tts_width, st.tts

    @staticmethod
    def _check_head(acc: Stash) -> None:
        p = len(acc.prompt_token_ids)
        if p == 0 or acc.rows < p or not acc.tts_width:
            raise APIError(502, f"the conditioning has {acc.rows} rows for a {p}-token prompt and "
                                f"{'no ' if not acc.tts_width else ''}TTS embeddings", type_="upstream_error")
        if acc.embed_width != acc.tts_width:
            raise APIError(502, f"TTS embeddings of width {acc.tts_width} for word embeddings of width "
                                f"{acc.embed_width}", type_="upstream_error")

    @staticmethod
    def _check_end(acc: Stash) -> None:
        if acc.rows != len(acc.token_ids) - 1:
            raise APIError(502, f"the conditioning has {acc.rows} rows for {len(acc.token_ids)} tokens; want one row "
                                "per token but the last", type_="upstream_error")

    async def _generate_fed(self, req: Request, conn: Conn, body: dict[str, Any], handles: list[tuple[str, str]],
                            sp: Any, max_frames: int) -> Response | None:
        """A request on an async-chunk Talker engine: the engine request
        starts once the prompt's rows and the first reply row are in, and
        the feed puts each later row while the frames stream."""
        rid = req.request_id
        done = [False] * len(handles)
        batches = self._batches(handles, done, bool(body.get("async_chunk")))
        acc = Stash()
        end = False
        feed: talker_feed.ChunkFeed | None = None
        feeder: asyncio.Future[None] | None = None
        pending: asyncio.Future[Any] | None = None
        outputs: Any = None
        try:
            try:
                async for st, end in batches:  # the head: until chunk 0 can be put
                    self._absorb(acc, st)
                    if end or (acc.prompt_token_ids and acc.rows >= len(acc.prompt_token_ids) + 1):
                        break
            except client.FetchError as e:
                raise APIError(e.status, str(e), type_="upstream_error", code="conditioning_unavailable") from None
            self._check_head(acc)
            if end:
                self._check_end(acc)
            await conn.start_stream()
            outputs = self.w.outputs(talker_feed.prompt(acc.prompt_token_ids), sp, rid)
            it = outputs.__aiter__()
            pending = asyncio.ensure_future(it.__anext__())
            eid = await talker_feed.engine_request_id(self.w.engine, rid, pending, self._fed)
            if eid is not None:
                self._fed.add(eid)
                feed = talker_feed.ChunkFeed(eid, self.w.spec.stage_id)
                feed.put(acc, end)
                if not end:
                    feeder = asyncio.ensure_future(self._feed(batches, acc, feed))
            frames = sent = sampled = 0
            try:
                while True:
                    waits: set[asyncio.Future[Any]] = {pending}
                    if feeder is not None and not feeder.done():
                        waits.add(feeder)
                    ready, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    if feeder is not None and feeder in ready:
                        feeder.result()  # a Thinker that failed mid-answer ends the stream here
                    if pending not in ready:
                        continue
                    try:
                        out = pending.result()
                    except StopAsyncIteration:
                        break
                    stop = False
                    for frame in self._new_frames(out, sent, sampled):
                        if frame is None:
                            stop = True
                            break
                        await conn.send_event({"frame": frame})
                        frames += 1
                        sent += 1
                        self.w.metrics.record_frames(1)
                        if sent >= max_frames:
                            stop = True
                            break
                    sampled = self._sampled(out, sampled)
                    if stop or out.finished:
                        break
                    pending = asyncio.ensure_future(it.__anext__())
            except (ClientGone, asyncio.CancelledError):
                raise
            except Exception as e:  # the stream has begun: its error is an event, then [DONE]
                msg = e.message if isinstance(e, APIError) else f"{type(e).__name__}: {e}"
                log.error("talker generation failed: %s", msg, extra={"request_id": rid})
                await conn.send_event({"error": msg})
                await conn.send_event("[DONE]")
                return None
            await conn.send_event({"done": True, "frames": frames})
            await conn.send_event("[DONE]")
            return None
        finally:
            # Stop the engine request (the outputs' own cleanup aborts one
            # left unfinished), then the feed, then free what is unread.
            for task in (pending, feeder):
                if task is not None and not task.done():
                    task.cancel()
                    try:
                        await task
                    except BaseException:  # noqa: BLE001 - its end is all that is wanted here
                        pass
            if outputs is not None:
                await outputs.aclose()
            await batches.aclose()
            if feed is not None:
                feed.release()
                self._fed.discard(feed.key)
            self._release(handles, done)

    async def _feed(self, batches: AsyncIterator[tuple[Stash, bool]], acc: Stash, feed: talker_feed.ChunkFeed) -> None:
        """Puts each batch of rows as it comes, until the last."""
        try:
            async for st, end in batches:
                self._absorb(acc, st)
                if end:
                    self._check_end(acc)
                feed.put(acc, end)
                if end:
                    return
        except client.FetchError as e:
            raise APIError(e.status, f"the Thinker's conditioning failed mid-answer: {e}",
                           type_="upstream_error") from None

    def _release(self, handles: list[tuple[str, str]], done: list[bool]) -> None:
        """Frees on the Thinker workers what was not read to its end (the
        request failed or was cancelled), in the background."""
        for (url, key), d in zip(handles, done):
            if d:
                continue

            async def drop(url: str = url, key: str = key) -> None:
                try:
                    await client.release(url, key, self.w.secret)
                except client.FetchError as e:
                    log.warning("could not release conditioning %s; it is freed at its TTL: %s", key, e)

            task = asyncio.ensure_future(drop())
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)

    # ---- the engine ----

    def _prompt(self, st: Stash, rid: str) -> Any:
        """The Talker's prompt, built by vllm-omni's thinker2talker from a
        source output made of the rows."""
        from vllm_omni.model_executor.stage_input_processors.qwen3_omni import thinker2talker  # noqa: PLC0415

        if st.rows == 0 or not st.tts_width:
            raise APIError(502, f"the conditioning has {st.rows} rows and {'no' if not st.tts_width else ''} TTS "
                                "embeddings", type_="upstream_error")
        if st.rows != len(st.token_ids) - 1:
            raise APIError(502, f"the conditioning has {st.rows} rows for {len(st.token_ids)} tokens; want one row "
                                "per token but the last", type_="upstream_error")
        if st.embed_width != st.tts_width:
            raise APIError(502, f"TTS embeddings of width {st.tts_width} for word embeddings of width "
                                f"{st.embed_width}", type_="upstream_error")
        layer = self.w.facts.accept_hidden_layer or 24
        p = len(st.prompt_token_ids)
        w = st.tts_width
        mm = {
            "hidden_states": {"layers": {0: tensors.engine_rows(bytes(st.embed), st.rows, st.embed_width),
                                         layer: tensors.engine_rows(bytes(st.hidden), st.rows, st.hidden_width)}},
            "embed": {role: tensors.engine_vector(st.tts[4 * w * i:4 * w * (i + 1)])
                      for i, role in enumerate(("tts_pad", "tts_bos", "tts_eos"))},
        }
        source = SimpleNamespace(
            request_id=rid, prompt_token_ids=list(st.prompt_token_ids), finished=True,
            outputs=[SimpleNamespace(cumulative_token_ids=list(st.token_ids[p:]), token_ids=list(st.token_ids[p:]),
                                     multimodal_output=mm)])
        prompts = thinker2talker([source], None, False, None)
        if len(prompts) != 1:
            raise APIError(500, f"vllm-omni's thinker2talker built {len(prompts)} Talker prompts from one output",
                           type_="server_error")
        return prompts[0]

    async def _frames(self, prompt: Any, sp: Any, rid: str, max_frames: int) -> Any:
        """The codec frames of the engine's answer, at most max_frames."""
        sent = 0
        sampled = 0
        outputs = self.w.outputs(prompt, sp, rid)
        try:
            async for out in outputs:
                for frame in self._new_frames(out, sent, sampled):
                    if frame is None:
                        return
                    yield frame
                    sent += 1
                    if sent >= max_frames:
                        return
                sampled = self._sampled(out, sampled)
        finally:
            await outputs.aclose()

    @staticmethod
    def _sampled(out: Any, before: int) -> int:
        o = out.outputs[0] if out.outputs else None
        if o is None:
            return before
        cum = getattr(o, "cumulative_token_ids", None)
        return len(cum) if cum else before + len(o.token_ids)

    def _new_frames(self, out: Any, sent: int, before: int) -> Any:
        """The frames out brings beyond the sent ones; None for the stop."""
        sampled = self._sampled(out, before)
        o = out.outputs[0] if out.outputs else None
        if o is None:
            return
        mm = getattr(o, "multimodal_output", None) or {}
        codes = (mm.get("codes") or {}).get("audio") if isinstance(mm.get("codes"), dict) else None
        if codes is None:
            codes = mm.get("codes.audio", mm.get("code_predictor_codes"))
        if codes is None:
            return
        rows = tensors.int_rows(codes)
        steps = sampled - 1  # each decode step consumed one sampled token
        base = len(rows) - steps
        if base < 0:
            raise APIError(500, f"the Talker's codes hold {len(rows)} rows after {steps} decode steps",
                           type_="server_error")
        for k in range(sent, steps):
            frame = rows[base + k]
            if frame[0] == CODEC_STOP:
                yield None
                return
            if len(frame) != CODEBOOKS or not all(0 <= c < CODEBOOK_SIZE for c in frame):
                raise APIError(500, f"the Talker's frame {k} is {frame}; want {CODEBOOKS} ids in "
                                    f"0..{CODEBOOK_SIZE - 1}", type_="server_error")
            yield frame
