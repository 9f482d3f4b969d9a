#!/bin/sh
# vllm serve instances for omnipd: 3 planned.
# note: stage 0: false booleans left to vLLM's default: async_scheduling
# note: stage 1: false booleans left to vLLM's default: async_scheduling
# note: stage 2: false booleans left to vLLM's default: async_scheduling
# note: stage 0: ECExampleConnector keeps every encoder output under /tmp/ec_cache (shared_storage_path), one directory per media item, and never deletes one: every encoder and prefill instance must see that directory, and it grows until you clear it
#
# Run it in a terminal of its own, or in the background with its own log:
#   sh launch.sh > launch.log 2>&1 &
# It starts every instance (each logs to NAME.log), waits until each answers
# /health, prints the omnipd serve command to run next, and stays while the
# instances run. It exits non-zero when vllm is missing or an instance exits,
# stopping the others; stopping it (Ctrl-C, kill) stops them all.
set -eu

command -v vllm >/dev/null 2>&1 || { echo "launch.sh: vllm is not on PATH: install vLLM or activate its environment, then run this again" >&2; exit 127; }
command -v curl >/dev/null 2>&1 || { echo "launch.sh: curl is not on PATH; this script polls each instance's /health with it" >&2; exit 127; }

# The deployment secret, made once and kept (owner-only) for omnipd serve --secret-file.
[ -s omnipd-secret ] || (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > omnipd-secret)

# name|pid|url of each instance started; every one is stopped when this script ends.
instances=
started() { instances="$instances $1|$2|$3"; }
stop() { for i in $instances; do p=${i#*|}; kill "${p%%|*}" 2>/dev/null || true; done; }
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
failed() {
  echo "launch.sh: $1 exited$2; stopping the others. The end of $1.log:" >&2
  tail -n 20 "$1.log" >&2 || true
  exit 1
}

# thinker-encoder-0: stage 0 (encoder), replica 0 -> http://127.0.0.1:8100
VLLM_API_KEY="$(cat omnipd-secret)" \
CUDA_VISIBLE_DEVICES=0,1 \
vllm serve Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --host 127.0.0.1 \
  --port 8100 \
  --served-model-name Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --tensor-parallel-size 2 \
  --ec-transfer-config '{"ec_connector":"ECExampleConnector","ec_role":"ec_producer","engine_id":"thinker-encoder","ec_connector_extra_config":{"shared_storage_path":"/tmp/ec_cache"}}' \
  --max-num-seqs 1 \
  --gpu-memory-utilization 0.9 \
  --enforce-eager \
  --distributed-executor-backend mp \
  --no-enable-prefix-caching \
  --max-num-batched-tokens 114688 > thinker-encoder-0.log 2>&1 &
started thinker-encoder-0 $! http://127.0.0.1:8100

# thinker-prefill-0: stage 1 (prefill), replica 0 -> http://127.0.0.1:8101
VLLM_API_KEY="$(cat omnipd-secret)" \
CUDA_VISIBLE_DEVICES=2,3 \
VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1 \
VLLM_NIXL_SIDE_CHANNEL_PORT=5600 \
vllm serve Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --host 127.0.0.1 \
  --port 8101 \
  --served-model-name Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --tensor-parallel-size 2 \
  --ec-transfer-config '{"ec_connector":"ECExampleConnector","ec_role":"ec_consumer","engine_id":"thinker-prefill","ec_connector_extra_config":{"shared_storage_path":"/tmp/ec_cache"}}' \
  --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both","engine_id":"thinker-prefill","kv_buffer_device":"cuda","kv_port":5600}' \
  --max-num-seqs 1 \
  --gpu-memory-utilization 0.9 \
  --enforce-eager \
  --distributed-executor-backend mp \
  --enable-prefix-caching > thinker-prefill-0.log 2>&1 &
started thinker-prefill-0 $! http://127.0.0.1:8101

# thinker-decode-0: stage 2 (decode), replica 0 -> http://127.0.0.1:8102
VLLM_API_KEY="$(cat omnipd-secret)" \
CUDA_VISIBLE_DEVICES=4,5 \
VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1 \
VLLM_NIXL_SIDE_CHANNEL_PORT=5601 \
vllm serve Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --host 127.0.0.1 \
  --port 8102 \
  --served-model-name Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --tensor-parallel-size 2 \
  --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both","engine_id":"thinker-decode","kv_buffer_device":"cuda","kv_port":5601}' \
  --max-num-seqs 1 \
  --gpu-memory-utilization 0.9 \
  --enforce-eager \
  --distributed-executor-backend mp \
  --enable-prefix-caching > thinker-decode-0.log 2>&1 &
started thinker-decode-0 $! http://127.0.0.1:8102

# The omnipd config naming these instances, for:
#   omnipd serve --config omnipd-vllm.yaml --secret-file omnipd-secret --served-model-name Qwen/Qwen3-Omni-30B-A3B-Instruct
cat > omnipd-vllm.yaml <<'EOF'
pipeline: qwen3_omni_moe_thinker
async_chunk: false
connectors: {}
pd:
  connector: NixlConnector
  devices: 0,1,2,3,4,5
  min_prefill_tokens: 0
  prefill_retries: 1
  fallback: none
stages:
  - stage_id: 0
    model_stage: thinker
    is_encoder_only: true
    input_sources: []
    final_output: false
    final_output_type: null
    devices: 0,1
    tensor_parallel_size: 2
    num_replicas: 1
    replicas:
      - devices: 0,1
        engine_id: thinker-encoder
        endpoint: http://127.0.0.1:8100
    kv_transfer_config: null
    ec_transfer_config:
      ec_connector: ECExampleConnector
      ec_role: ec_producer
      engine_id: thinker-encoder
      ec_connector_extra_config:
        shared_storage_path: /tmp/ec_cache
    input_connectors: {}
    output_connectors: {}
    default_sampling_params: {}
    engine_args:
      max_num_seqs: 1
      gpu_memory_utilization: 0.9
      enforce_eager: true
      async_scheduling: false
      distributed_executor_backend: mp
      enable_prefix_caching: false
      max_num_batched_tokens: 114688
  - stage_id: 1
    model_stage: thinker
    is_prefill_only: true
    input_sources: [0]
    final_output: false
    final_output_type: null
    devices: 2,3
    tensor_parallel_size: 2
    num_replicas: 1
    replicas:
      - devices: 2,3
        engine_id: thinker-prefill
        kv_port: 5600
        endpoint: http://127.0.0.1:8101
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_both
      engine_id: thinker-prefill
      kv_buffer_device: cuda
      kv_port: 5600
    ec_transfer_config:
      ec_connector: ECExampleConnector
      ec_role: ec_consumer
      ec_connector_extra_config:
        shared_storage_path: /tmp/ec_cache
    input_connectors: {}
    output_connectors: {}
    default_sampling_params: {}
    engine_args:
      max_num_seqs: 1
      gpu_memory_utilization: 0.9
      enforce_eager: true
      async_scheduling: false
      distributed_executor_backend: mp
      enable_prefix_caching: true
  - stage_id: 2
    model_stage: thinker
    is_decode_only: true
    input_sources: [1]
    final_output: true
    final_output_type: text
    devices: 4,5
    tensor_parallel_size: 2
    num_replicas: 1
    replicas:
      - devices: 4,5
        engine_id: thinker-decode
        kv_port: 5601
        endpoint: http://127.0.0.1:8102
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_both
      engine_id: thinker-decode
      kv_buffer_device: cuda
      kv_port: 5601
    input_connectors: {}
    output_connectors: {}
    default_sampling_params:
      temperature: 0.4
      top_p: 0.9
      top_k: 1
      max_tokens: 2048
      seed: 42
      repetition_penalty: 1.05
    engine_args:
      max_num_seqs: 1
      gpu_memory_utilization: 0.9
      enforce_eager: true
      async_scheduling: false
      distributed_executor_backend: mp
      enable_prefix_caching: true
EOF

timeout=${VLLM_READY_TIMEOUT:-1800}
deadline=$(( $(date +%s) + timeout ))
for i in $instances; do
  name=${i%%|*}; rest=${i#*|}; pid=${rest%%|*}; url=${rest#*|}
  echo "launch.sh: waiting for $name at $url/health (log: $name.log)"
  until curl -fsS -o /dev/null --max-time 5 "$url/health" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || failed "$name" " before it was ready"
    [ "$(date +%s)" -lt "$deadline" ] || { echo "launch.sh: $name not ready within ${timeout}s; set VLLM_READY_TIMEOUT to wait longer" >&2; exit 1; }
    sleep 2
  done
  echo "launch.sh: $name ready"
done
echo "launch.sh: every instance is ready. Next, in another terminal:"
echo '  omnipd serve --config omnipd-vllm.yaml --secret-file omnipd-secret --served-model-name Qwen/Qwen3-Omni-30B-A3B-Instruct'
echo "launch.sh: running until an instance exits or this script is stopped (Ctrl-C)"
while :; do
  for i in $instances; do
    rest=${i#*|}
    kill -0 "${rest%%|*}" 2>/dev/null || failed "${i%%|*}" ""
  done
  sleep 2
done
