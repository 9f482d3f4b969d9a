#!/bin/sh
# vllm-omni stage workers for omnipd: 4 planned.
# note: every stage runs omnipd's vllm-omni stage worker (python3 -m omnipd_stage, written against vllm-omni 0.32.0), which reads each stage's engine arguments from omnipd-vllm-omni.yaml; its command line repeats the ones vllm serve takes as flags
#
# Run it in a terminal of its own, or in the background with its own log:
#   sh launch.sh > launch.log 2>&1 &
# It starts every instance (each logs to NAME.log), waits until each answers
# /health, prints the omnipd serve command to run next, and stays while the
# instances run. It exits non-zero when python3 or vllm_omni is missing or an instance exits,
# stopping the others; stopping it (Ctrl-C, kill) stops them all.
set -eu

command -v python3 >/dev/null 2>&1 || { echo "launch.sh: python3 is not on PATH: install vllm-omni 0.32.0 (pip install vllm==0.32.0 vllm-omni==0.32.0) or activate its environment, then run this again" >&2; exit 127; }
python3 -c 'import vllm_omni' >/dev/null 2>&1 || { echo "launch.sh: python3 cannot import vllm_omni: install vllm-omni 0.32.0 (pip install vllm==0.32.0 vllm-omni==0.32.0) or activate its environment, then run this again" >&2; exit 127; }
command -v curl >/dev/null 2>&1 || { echo "launch.sh: curl is not on PATH; this script polls each instance's /health with it" >&2; exit 127; }

# The deployment secret, made once and kept (owner-only) for omnipd serve --secret-file.
[ -s omnipd-secret ] || (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > omnipd-secret)

# omnipd's vllm-omni stage worker (written against vllm-omni 0.32.0), from this omnipd:
# the package omnipd_stage in omnipd-stage/, which every worker has on its PYTHONPATH.
rm -rf omnipd-stage/omnipd_stage && mkdir -p omnipd-stage/omnipd_stage
cat > omnipd-stage/omnipd_stage/__init__.py <<'EOF'
"""stand-in for the stage worker's package"""
EOF
cat > omnipd-stage/omnipd_stage/__main__.py <<'EOF'
import sys
sys.exit(2)
EOF

# The vllm-omni deploy config every stage worker reads (--deploy-config).
cat > omnipd-vllm-omni.yaml <<'EOF'
# vllm-omni deploy config of omnipd's stage workers (python3 -m omnipd_stage --deploy-config).
# Each worker runs one stage (--stage-id); its devices (CUDA_VISIBLE_DEVICES), ports and
# KV transfer config are on its own command line, so no stage here names them.
pipeline: qwen3_omni_moe
async_chunk: true
connectors:
  connector_of_shared_memory:
    name: SharedMemoryConnector
    extra:
      initial_codec_chunk_frames: 4
      codec_chunk_frames: 25
      codec_left_context_frames: 25
stages:
  - stage_id: 0
    tensor_parallel_size: 1
    default_sampling_params:
      temperature: 0.0
      max_tokens: 2048
    max_num_batched_tokens: 32768
    max_num_seqs: 64
    gpu_memory_utilization: 0.9
    trust_remote_code: true
    enable_prefix_caching: false
  - stage_id: 1
    tensor_parallel_size: 1
    input_connectors:
      from_stage_0: connector_of_shared_memory
    default_sampling_params:
      temperature: 0.9
      top_k: 50
      max_tokens: 4096
      repetition_penalty: 1.05
      detokenize: false
      stop_token_ids: [2150]
    max_num_batched_tokens: 32768
    max_num_seqs: 64
    gpu_memory_utilization: 0.6
    trust_remote_code: true
    enable_prefix_caching: false
  - stage_id: 2
    tensor_parallel_size: 1
    input_connectors:
      from_stage_1: connector_of_shared_memory
    default_sampling_params:
      temperature: 0.0
      top_p: 1.0
      top_k: -1
      max_tokens: 65536
      repetition_penalty: 1.1
    max_num_batched_tokens: 65536
    max_num_seqs: 64
    gpu_memory_utilization: 0.1
    enforce_eager: false
    trust_remote_code: true
    enable_prefix_caching: false
    enable_chunked_prefill: false
    async_scheduling: false
EOF

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

# thinker-prefill-0: stage 0 (prefill), replica 0 -> http://127.0.0.1:8100
VLLM_API_KEY="$(cat omnipd-secret)" \
CUDA_VISIBLE_DEVICES=0 \
PYTHONPATH="$PWD"/omnipd-stage${PYTHONPATH:+:$PYTHONPATH} \
VLLM_MOONCAKE_BOOTSTRAP_PORT=8998 \
python3 -m omnipd_stage Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --deploy-config omnipd-vllm-omni.yaml \
  --stage-id 0 \
  --host 127.0.0.1 \
  --port 8100 \
  --served-model-name Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --tensor-parallel-size 1 \
  --kv-transfer-config '{"kv_connector":"MooncakeConnector","kv_role":"kv_producer","engine_id":"thinker-prefill"}' \
  --conditioning-layer 24 \
  --max-num-batched-tokens 32768 \
  --max-num-seqs 64 \
  --gpu-memory-utilization 0.9 \
  --trust-remote-code \
  --no-enable-prefix-caching > thinker-prefill-0.log 2>&1 &
started thinker-prefill-0 $! http://127.0.0.1:8100

# thinker-decode-0: stage 1 (decode), replica 0 -> http://127.0.0.1:8101
VLLM_API_KEY="$(cat omnipd-secret)" \
CUDA_VISIBLE_DEVICES=1 \
PYTHONPATH="$PWD"/omnipd-stage${PYTHONPATH:+:$PYTHONPATH} \
python3 -m omnipd_stage Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --deploy-config omnipd-vllm-omni.yaml \
  --stage-id 0 \
  --host 127.0.0.1 \
  --port 8101 \
  --served-model-name Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --tensor-parallel-size 1 \
  --kv-transfer-config '{"kv_connector":"MooncakeConnector","kv_role":"kv_consumer","engine_id":"thinker-decode"}' \
  --conditioning-layer 24 \
  --max-num-batched-tokens 32768 \
  --max-num-seqs 64 \
  --gpu-memory-utilization 0.9 \
  --trust-remote-code \
  --no-enable-prefix-caching > thinker-decode-0.log 2>&1 &
started thinker-decode-0 $! http://127.0.0.1:8101

# talker-0: stage 2 (full), replica 0 -> http://127.0.0.1:8102
VLLM_API_KEY="$(cat omnipd-secret)" \
CUDA_VISIBLE_DEVICES=2 \
PYTHONPATH="$PWD"/omnipd-stage${PYTHONPATH:+:$PYTHONPATH} \
python3 -m omnipd_stage Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --deploy-config omnipd-vllm-omni.yaml \
  --stage-id 1 \
  --host 127.0.0.1 \
  --port 8102 \
  --tensor-parallel-size 1 \
  --max-num-batched-tokens 32768 \
  --max-num-seqs 64 \
  --gpu-memory-utilization 0.6 \
  --trust-remote-code \
  --no-enable-prefix-caching > talker-0.log 2>&1 &
started talker-0 $! http://127.0.0.1:8102

# code2wav-0: stage 3 (full), replica 0 -> http://127.0.0.1:8103
VLLM_API_KEY="$(cat omnipd-secret)" \
CUDA_VISIBLE_DEVICES=2 \
PYTHONPATH="$PWD"/omnipd-stage${PYTHONPATH:+:$PYTHONPATH} \
python3 -m omnipd_stage Qwen/Qwen3-Omni-30B-A3B-Instruct \
  --deploy-config omnipd-vllm-omni.yaml \
  --stage-id 2 \
  --host 127.0.0.1 \
  --port 8103 \
  --tensor-parallel-size 1 \
  --max-num-batched-tokens 65536 \
  --max-num-seqs 64 \
  --gpu-memory-utilization 0.1 \
  --trust-remote-code \
  --no-enable-prefix-caching > code2wav-0.log 2>&1 &
started code2wav-0 $! http://127.0.0.1:8103

# The omnipd config naming these instances, for:
#   omnipd serve --config omnipd-vllm.yaml --secret-file omnipd-secret --served-model-name Qwen/Qwen3-Omni-30B-A3B-Instruct
cat > omnipd-vllm.yaml <<'EOF'
pipeline: qwen3_omni_moe
async_chunk: true
connectors:
  connector_of_shared_memory:
    name: SharedMemoryConnector
    extra:
      initial_codec_chunk_frames: 4
      codec_chunk_frames: 25
      codec_left_context_frames: 25
pd:
  connector: MooncakeConnector
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
    devices: "0"
    tensor_parallel_size: 1
    num_replicas: 1
    replicas:
      - devices: "0"
        engine_id: thinker-prefill
        kv_port: 8998
        endpoint: http://127.0.0.1:8100
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
      engine_id: thinker-prefill
      kv_connector_extra_config:
        mooncake_bootstrap_port: 8998
    input_connectors: {}
    output_connectors: {}
    default_sampling_params: {}
    engine_args:
      max_num_batched_tokens: 32768
      max_num_seqs: 64
      gpu_memory_utilization: 0.9
      trust_remote_code: true
      enable_prefix_caching: false
      accept_hidden_layer: 24
  - stage_id: 1
    model_stage: thinker
    is_decode_only: true
    input_sources: [0]
    final_output: true
    final_output_type: text
    devices: "1"
    tensor_parallel_size: 1
    num_replicas: 1
    replicas:
      - devices: "1"
        engine_id: thinker-decode
        endpoint: http://127.0.0.1:8101
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
      engine_id: thinker-decode
    input_connectors: {}
    output_connectors: {}
    default_sampling_params:
      temperature: 0.0
      max_tokens: 2048
    engine_args:
      max_num_batched_tokens: 32768
      max_num_seqs: 64
      gpu_memory_utilization: 0.9
      trust_remote_code: true
      enable_prefix_caching: false
      accept_hidden_layer: 24
  - stage_id: 2
    model_stage: talker
    input_sources: [1]
    final_output: false
    final_output_type: null
    devices: "2"
    tensor_parallel_size: 1
    num_replicas: 1
    replicas:
      - devices: "2"
        endpoint: http://127.0.0.1:8102
    kv_transfer_config: null
    input_connectors:
      from_stage_1: connector_of_shared_memory
    output_connectors: {}
    default_sampling_params:
      temperature: 0.9
      top_k: 50
      max_tokens: 4096
      repetition_penalty: 1.05
      detokenize: false
      stop_token_ids: [2150]
    engine_args:
      max_num_batched_tokens: 32768
      max_num_seqs: 64
      gpu_memory_utilization: 0.6
      trust_remote_code: true
      enable_prefix_caching: false
  - stage_id: 3
    model_stage: code2wav
    input_sources: [2]
    final_output: true
    final_output_type: audio
    devices: "2"
    tensor_parallel_size: 1
    num_replicas: 1
    replicas:
      - devices: "2"
        endpoint: http://127.0.0.1:8103
    kv_transfer_config: null
    input_connectors:
      from_stage_2: connector_of_shared_memory
    output_connectors: {}
    default_sampling_params:
      temperature: 0.0
      top_p: 1.0
      top_k: -1
      max_tokens: 65536
      repetition_penalty: 1.1
    engine_args:
      max_num_batched_tokens: 65536
      max_num_seqs: 64
      gpu_memory_utilization: 0.1
      enforce_eager: false
      trust_remote_code: true
      enable_prefix_caching: false
      enable_chunked_prefill: false
      async_scheduling: false
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
