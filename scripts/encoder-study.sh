#!/usr/bin/env bash
# Reproduces the encoder-disaggregation comparison of docs/benchmarks.md:
# the same three (modeled) H100s as three colocated Thinker instances, as two
# prefill instances and one decode (P/D), and as one encoder, one prefill and
# one decode (E/P/D), each swept over request rates on an audio-input
# workload — a 30-second clip and a short question per request — under the
# calibrated latency model (docs/simulate.md: its encoder section). Writes
# JSON and Markdown under $OUT.
#
#   scripts/encoder-study.sh                # about 8 minutes
#   DURATION=8s scripts/encoder-study.sh    # a quicker, noisier look
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-docs/benchmarks/encoder}"
DURATION="${DURATION:-20s}"
PROFILE="${PROFILE:-h100-qwen3-omni-30b-a3b}"
PORT="${PORT:-18791}"
RATES="${RATES:-4,8,12,16,20}"
CLIP="${CLIP:-30}" # seconds of audio a request
SLO="${SLO:-ttft=300ms,tpot=50ms}"
SEED=7
read -r -a TOPOLOGIES <<<"${TOPOLOGIES:-colocated-3x pd-2p1d epd-1e1p1d}"
declare -A SERVE_FLAGS=([colocated-3x]="--pd=false" [pd-2p1d]="" [epd-1e1p1d]="")
declare -A LABEL=([colocated-3x]="colocated ×3" [pd-2p1d]="P/D 2P+1D" [epd-1e1p1d]="E/P/D 1E+1P+1D")

mkdir -p "$OUT"
bin="$(mktemp -d)/omnipd"
echo "== building omnipd"
go build -o "$bin" ./cmd/omnipd

# shellcheck source=scripts/lib/serve.sh
. scripts/lib/serve.sh
trap stop_serve EXIT

for topo in "${TOPOLOGIES[@]}"; do
  echo "== $topo: omnipd serve --simulate $PROFILE"
  # shellcheck disable=SC2086 # the flags are words
  start_serve "$OUT/$topo.serve.log" --config "docs/benchmarks/$topo.yaml" ${SERVE_FLAGS[$topo]} --simulate "$PROFILE"
  grep -E '^stage .* ready at ' "$OUT/$topo.serve.log"
  echo "== $topo: ${CLIP} s clips, rates $RATES, $DURATION each"
  "$bin" bench --base-url "http://127.0.0.1:$PORT" --seed "$SEED" \
    --dataset random-mm --random-mm-bucket-config "{(0, $CLIP, 1): 1.0}" --random-mm-limit-mm-per-prompt '{"audio": 1}' \
    --input-len 16 --output-len 64 --sweep "$RATES" --duration "$DURATION" --warmup 4 --slo "$SLO" \
    --output-json "$OUT/$topo.json" >"$OUT/$topo.md"
  stop_serve
done

args=()
for topo in "${TOPOLOGIES[@]}"; do
  [ -f "$OUT/$topo.json" ] && args+=("${LABEL[$topo]}=$OUT/$topo.json")
done
echo "== comparing"
"$bin" bench compare --title "${CLIP} s audio clips, 64-token answers" "${args[@]}" | tee "$OUT/compare.md"
