"""Stand-in for vllm.entrypoints."""
