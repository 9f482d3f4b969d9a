"""Tests of omnipd's vllm-omni stage worker (standard-library unittest)."""
