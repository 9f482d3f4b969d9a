"""Stand-in for vllm_omni/inputs (vllm-omni v0.32.0)."""
