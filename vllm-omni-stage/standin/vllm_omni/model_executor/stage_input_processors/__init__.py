"""Stand-in for vllm_omni/model_executor/stage_input_processors (vllm-omni v0.32.0)."""
