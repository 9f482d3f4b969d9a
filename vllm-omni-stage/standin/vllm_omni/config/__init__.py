"""Stand-in for vllm_omni/config (vllm-omni v0.32.0)."""
