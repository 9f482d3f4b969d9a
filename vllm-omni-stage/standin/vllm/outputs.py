"""Stand-in for vllm/outputs.py (vLLM v0.32): ``CompletionOutput`` and
``RequestOutput`` with the fields the worker reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CompletionOutput:
    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: Any = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # vllm-omni's MultimodalCompletionOutput adds these two
    # (vllm_omni/engine/output_processor.py, _new_completion_output).
    multimodal_output: Any = None
    cumulative_token_ids: list[int] = field(default_factory=list)


class RequestOutput:
    def __init__(self, request_id: str = "", prompt: Any = None, prompt_token_ids: list[int] | None = None,
                 outputs: list[CompletionOutput] | None = None, finished: bool = False,
                 num_cached_tokens: int | None = None, kv_transfer_params: dict[str, Any] | None = None) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.outputs = outputs or []
        self.finished = finished
        self.num_cached_tokens = num_cached_tokens
        self.kv_transfer_params = kv_transfer_params
