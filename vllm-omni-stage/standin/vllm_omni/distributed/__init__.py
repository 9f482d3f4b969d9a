"""Stand-in for vllm_omni/distributed (vllm-omni main at 0342827d)."""
