"""Stand-in for vllm_omni/model_executor (vllm-omni v0.32.0)."""
