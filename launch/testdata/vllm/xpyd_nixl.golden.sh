#!/bin/sh
# vllm serve instances for omnipd: 3 planned.
set -e

# The deployment secret, made once and kept (owner-only) for omnipd serve --secret-file.
[ -s omnipd-secret ] || (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > omnipd-secret)

# thinker-prefill-0: stage 0 (prefill), replica 0 -> http://127.0.0.1:8100
VLLM_API_KEY="$(cat omnipd-secret)" \
CUDA_VISIBLE_DEVICES=0 \
VLLM_LOGGING_LEVEL=INFO \
VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1 \
VLLM_NIXL_SIDE_CHANNEL_PORT=5600 \
vllm serve Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --host 127.0.0.1 \
  --port 8100 \
  --served-model-name Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --tensor-parallel-size 1 \
  --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both","engine_id":"thinker-prefill-0","kv_buffer_device":"cuda","kv_port":5600}' \
  --max-num-seqs 32 \
  --gpu-memory-utilization 0.85 \
  --trust-remote-code &

# thinker-prefill-1: stage 0 (prefill), replica 1 -> http://127.0.0.1:8101
VLLM_API_KEY="$(cat omnipd-secret)" \
CUDA_VISIBLE_DEVICES=1 \
VLLM_LOGGING_LEVEL=INFO \
VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1 \
VLLM_NIXL_SIDE_CHANNEL_PORT=5601 \
vllm serve Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --host 127.0.0.1 \
  --port 8101 \
  --served-model-name Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --tensor-parallel-size 1 \
  --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both","engine_id":"thinker-prefill-1","kv_buffer_device":"cuda","kv_port":5601}' \
  --max-num-seqs 32 \
  --gpu-memory-utilization 0.85 \
  --trust-remote-code &

# thinker-decode-0: stage 1 (decode), replica 0 -> http://127.0.0.1:8102
VLLM_API_KEY="$(cat omnipd-secret)" \
CUDA_VISIBLE_DEVICES=2 \
VLLM_LOGGING_LEVEL=INFO \
VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1 \
VLLM_NIXL_SIDE_CHANNEL_PORT=5602 \
vllm serve Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --host 127.0.0.1 \
  --port 8102 \
  --served-model-name Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --tensor-parallel-size 1 \
  --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both","engine_id":"thinker-decode","kv_buffer_device":"cuda","kv_port":5602}' \
  --max-num-seqs 32 \
  --gpu-memory-utilization 0.85 \
  --trust-remote-code &

# The omnipd config naming these instances. Once each answers /health, run:
#   omnipd serve --config omnipd-vllm.yaml --secret-file omnipd-secret --served-model-name Qwen/Qwen3-Omni-30B-A3B-Instruct
cat > omnipd-vllm.yaml <<'EOF'
pipeline: qwen3_omni_moe_thinker
async_chunk: false
connectors: {}
pd:
  connector: NixlConnector
  devices: 0,1,2
  min_prefill_tokens: 0
  prefill_retries: 1
  fallback: none
stages:
  - stage_id: 0
    model_stage: thinker
    is_prefill_only: true
    input_sources: []
    final_output: false
    final_output_type: null
    devices: 0,1
    tensor_parallel_size: 1
    num_replicas: 2
    replicas:
      - devices: "0"
        engine_id: thinker-prefill-0
        kv_port: 5600
        endpoint: http://127.0.0.1:8100
      - devices: "1"
        engine_id: thinker-prefill-1
        kv_port: 5601
        endpoint: http://127.0.0.1:8101
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_both
      engine_id: thinker-prefill
      kv_buffer_device: cuda
      kv_port: 5600
    input_connectors: {}
    output_connectors: {}
    default_sampling_params: {}
    env:
      VLLM_LOGGING_LEVEL: INFO
    engine_args:
      max_num_seqs: 32
      gpu_memory_utilization: 0.85
      trust_remote_code: true
  - stage_id: 1
    model_stage: thinker
    is_decode_only: true
    input_sources: [0]
    final_output: true
    final_output_type: text
    devices: "2"
    tensor_parallel_size: 1
    num_replicas: 1
    replicas:
      - devices: "2"
        engine_id: thinker-decode
        kv_port: 5602
        endpoint: http://127.0.0.1:8102
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_both
      engine_id: thinker-decode
      kv_buffer_device: cuda
      kv_port: 5602
    input_connectors: {}
    output_connectors: {}
    default_sampling_params: {}
    env:
      VLLM_LOGGING_LEVEL: INFO
    engine_args:
      max_num_seqs: 32
      gpu_memory_utilization: 0.85
      trust_remote_code: true
EOF

wait
