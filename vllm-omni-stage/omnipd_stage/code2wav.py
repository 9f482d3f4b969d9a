"""A Code2Wav stage: omnipd's ``POST /v1/omnipd/code2wav`` on a
single-stage vllm-omni Code2Wav engine.

The request's codes are already in the layout the engine takes: frames
``[T, 16]`` flattened codebook-major, which is what vllm-omni's
``talker2code2wav`` builds as the Code2Wav prompt's ``prompt_token_ids``
(vllm_omni/model_executor/stage_input_processors/qwen3_omni.py) and what
qwen3_omni.py's code2wav forward reshapes to ``[1, 16, T]``. The engine's
answer is the waveform under ``multimodal_output["audio"]`` (the generation
runner's ``model_outputs``, renamed for the stage's audio modality by
vllm_omni/engine/output_processor.py), 24 kHz mono, 1920 samples per frame;
the samples of the first ``context_frames`` frames are trimmed here.
"""

from __future__ import annotations

import base64
import logging
from typing import Any

from . import tensors
from .errors import APIError, invalid
from .httpserver import Conn, Request, Response, json_response

log = logging.getLogger("omnipd_stage.code2wav")

CODEBOOKS = 16
CODEBOOK_SIZE = 2048
SAMPLES_PER_FRAME = 1920
SAMPLE_RATE = 24000


def read_request(body: dict[str, Any]) -> tuple[list[int], int, int]:
    """(codes, num_frames, context_frames), checked; a 400 naming the field."""
    n = body.get("num_frames")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise invalid("num_frames", "num_frames must be a non-negative integer")
    codes = body.get("codes")
    if not isinstance(codes, list):
        raise invalid("codes", "codes must be a list of codebook ids")
    if len(codes) != CODEBOOKS * n:
        raise invalid("codes", f"{len(codes)} codes for {n} frames; want {CODEBOOKS * n} "
                               f"({CODEBOOKS} per frame, codebook-major)")
    for i, c in enumerate(codes):
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < CODEBOOK_SIZE:
            raise invalid("codes", f"codes[{i}] is {c!r}; want a codebook id in 0..{CODEBOOK_SIZE - 1}")
    ctx = body.get("context_frames", 0)
    if ctx is None:
        ctx = 0
    if isinstance(ctx, bool) or not isinstance(ctx, int) or not 0 <= ctx <= n:
        raise invalid("context_frames", f"context_frames must be an integer in 0..num_frames ({n}), got {ctx!r}")
    return codes, n, ctx


def audio_of(out: Any) -> Any:
    o = out.outputs[0] if getattr(out, "outputs", None) else None
    mm = getattr(o, "multimodal_output", None) if o is not None else None
    if not mm:
        mm = getattr(out, "multimodal_output", None) or {}
    sr = mm.get("sr") if hasattr(mm, "get") else None
    if sr is not None and not isinstance(sr, (int, float)):
        sr = tensors.int_rows(sr)[-1][-1]  # a tensor, or a list of per-step ones
    if sr is not None and int(sr) != SAMPLE_RATE:
        raise APIError(500, f"the engine's audio is at {sr} Hz; omnipd's stage API carries {SAMPLE_RATE} Hz",
                       type_="server_error")
    for key in ("audio", "model_outputs"):
        v = mm.get(key) if hasattr(mm, "get") else None
        if v is not None:
            return v
    raise APIError(500, "the engine's Code2Wav output has no audio (multimodal_output['audio'])",
                   type_="server_error")


class Code2Wav:
    def __init__(self, worker: Any) -> None:
        self.w = worker

    async def decode(self, req: Request, conn: Conn) -> Response:
        codes, n, ctx = read_request(req.json_object())
        if n == 0:
            return json_response({"samples_f32le": "", "num_samples": 0})
        from vllm_omni.inputs.data import OmniTokensPrompt  # noqa: PLC0415

        prompt = OmniTokensPrompt(prompt_token_ids=codes)
        audio = None
        async for out in self.w.outputs(prompt, None, req.request_id):
            if out.finished:
                audio = audio_of(out)
        if audio is None:
            raise APIError(500, "the engine finished without audio", type_="server_error")
        pcm = tensors.samples(audio)
        got = len(pcm) // 4
        if got != SAMPLES_PER_FRAME * n:
            raise APIError(500, f"the engine returned {got} samples for {n} frames; want {SAMPLES_PER_FRAME} per frame",
                           type_="server_error")
        pcm = pcm[4 * SAMPLES_PER_FRAME * ctx:]
        self.w.metrics.record_samples(len(pcm) // 4)
        return json_response({"samples_f32le": base64.b64encode(pcm).decode(), "num_samples": len(pcm) // 4})
