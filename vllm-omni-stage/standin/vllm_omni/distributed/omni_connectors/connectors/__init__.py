"""Stand-in for vllm_omni/distributed/omni_connectors/connectors."""
