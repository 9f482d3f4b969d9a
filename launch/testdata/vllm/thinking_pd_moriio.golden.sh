#!/bin/sh
# vllm serve instances for omnipd: 2 planned.
# note: stage 0: false booleans left to vLLM's default: async_scheduling
# note: stage 1: false booleans left to vLLM's default: async_scheduling
set -e

# The deployment secret, made once and kept (owner-only) for omnipd serve --secret-file.
[ -s omnipd-secret ] || (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > omnipd-secret)

# thinker-prefill-0: stage 0 (prefill), replica 0 -> http://127.0.0.1:8100
VLLM_API_KEY="$(cat omnipd-secret)" \
CUDA_VISIBLE_DEVICES=0,1 \
VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1 \
vllm serve Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --host 127.0.0.1 \
  --port 8100 \
  --served-model-name Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --tensor-parallel-size 2 \
  --kv-transfer-config '{"kv_connector":"MoRIIOConnector","kv_role":"kv_producer","engine_id":"thinker-prefill","kv_port":6301}' \
  --max-num-seqs 1 \
  --gpu-memory-utilization 0.9 \
  --enforce-eager \
  --distributed-executor-backend mp \
  --enable-prefix-caching &

# thinker-decode-0: stage 1 (decode), replica 0 -> http://127.0.0.1:8101
VLLM_API_KEY="$(cat omnipd-secret)" \
CUDA_VISIBLE_DEVICES=2,3 \
VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1 \
vllm serve Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --host 127.0.0.1 \
  --port 8101 \
  --served-model-name Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --tensor-parallel-size 2 \
  --kv-transfer-config '{"kv_connector":"MoRIIOConnector","kv_role":"kv_consumer","engine_id":"thinker-decode","kv_port":6302}' \
  --max-num-seqs 1 \
  --gpu-memory-utilization 0.9 \
  --enforce-eager \
  --distributed-executor-backend mp \
  --enable-prefix-caching &

# The omnipd config naming these instances. Once each answers /health, run:
#   omnipd serve --config omnipd-vllm.yaml --secret-file omnipd-secret --served-model-name Qwen/Qwen3-Omni-30B-A3B-Instruct
cat > omnipd-vllm.yaml <<'EOF'
pipeline: qwen3_omni_moe_thinker
async_chunk: false
connectors: {}
pd:
  connector: MoRIIOConnector
  devices: 0,1,2,3
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
    tensor_parallel_size: 2
    num_replicas: 1
    replicas:
      - devices: 0,1
        engine_id: thinker-prefill
        kv_port: 6301
        endpoint: http://127.0.0.1:8100
    kv_transfer_config:
      kv_connector: MoRIIOConnector
      kv_role: kv_producer
      engine_id: thinker-prefill
      kv_port: 6301
    input_connectors: {}
    output_connectors: {}
    default_sampling_params: {}
    env:
      VLLM_DISABLE_REQUEST_ID_RANDOMIZATION: "1"
    engine_args:
      max_num_seqs: 1
      gpu_memory_utilization: 0.9
      enforce_eager: true
      async_scheduling: false
      distributed_executor_backend: mp
      enable_prefix_caching: true
  - stage_id: 1
    model_stage: thinker
    is_decode_only: true
    input_sources: [0]
    final_output: true
    final_output_type: text
    devices: 2,3
    tensor_parallel_size: 2
    num_replicas: 1
    replicas:
      - devices: 2,3
        engine_id: thinker-decode
        kv_port: 6302
        endpoint: http://127.0.0.1:8101
    kv_transfer_config:
      kv_connector: MoRIIOConnector
      kv_role: kv_consumer
      engine_id: thinker-decode
      kv_port: 6302
    input_connectors: {}
    output_connectors: {}
    default_sampling_params:
      temperature: 0.4
      top_p: 0.9
      top_k: 1
      max_tokens: 2048
      seed: 42
      repetition_penalty: 1.05
    env:
      VLLM_DISABLE_REQUEST_ID_RANDOMIZATION: "1"
    engine_args:
      max_num_seqs: 1
      gpu_memory_utilization: 0.9
      enforce_eager: true
      async_scheduling: false
      distributed_executor_backend: mp
      enable_prefix_caching: true
EOF

wait
