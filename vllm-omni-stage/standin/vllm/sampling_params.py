"""Stand-in for vllm/sampling_params.py (vLLM v0.32): ``SamplingParams``
with the fields the worker sets and vLLM's range checks (``_verify_args``),
and ``RequestOutputKind``."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class SamplingParams:
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    skip_special_tokens: bool = True
    detokenize: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    extra_args: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # vLLM's messages (SamplingParams._verify_args).
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disable), or at least 1, got {self.top_k}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                             f"got {self.min_tokens}.")
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])


def _drop() -> None:
    """The stand-in's OMNIPD_STANDIN_DROP test hook (see vllm_omni/_toy.py)."""
    import os  # noqa: PLC0415

    target = os.environ.get("OMNIPD_STANDIN_DROP", "")
    if target.startswith(__name__ + "."):
        globals().pop(target[len(__name__) + 1:], None)


_drop()
