"""Stand-in for vllm-omni (vllm-project/vllm-omni, v0.32.0): the modules,
names, arguments and output shapes omnipd's stage worker calls, backed by a
deterministic toy Qwen3-Omni (_toy.py). A test double: never installed in
production."""

__version__ = "0.32.0"
