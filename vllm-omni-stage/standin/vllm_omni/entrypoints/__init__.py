"""Stand-in for vllm_omni/entrypoints (vllm-omni v0.32.0)."""
