"""Stand-in for vllm_omni/outputs.py (vllm-omni v0.32.0): ``OmniRequestOutput``
is a vLLM ``RequestOutput`` with the stage's fields; ``multimodal_output``
is the first completion output's (where AR stages attach it), else its own."""

from __future__ import annotations

from typing import Any

from vllm.outputs import RequestOutput


class OmniRequestOutput(RequestOutput):
    def __init__(self, *, stage_id: int | None = 0, final_output_type: str = "text", error: str | None = None,
                 error_status_code: int | None = None, multimodal_output: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stage_id = stage_id
        self.final_output_type = final_output_type
        self.error = error
        self.error_status_code = error_status_code
        self._multimodal_output = multimodal_output or {}

    @property
    def multimodal_output(self) -> Any:
        for o in self.outputs:
            mm = getattr(o, "multimodal_output", None)
            if mm:
                return mm
        return self._multimodal_output
