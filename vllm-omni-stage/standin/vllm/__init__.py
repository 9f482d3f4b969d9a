"""Stand-in for the parts of vLLM (vllm-project/vllm, v0.32) that omnipd's
stage worker calls. A test double: never installed in production."""

from .sampling_params import RequestOutputKind, SamplingParams

__version__ = "0.32.0"
__all__ = ["RequestOutputKind", "SamplingParams"]
