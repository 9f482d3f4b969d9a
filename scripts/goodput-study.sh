#!/usr/bin/env bash
# Reproduces the goodput study of docs/benchmarks.md: the same two (modeled)
# H100s as two colocated Thinker instances, then as one prefill and one
# decode instance, each swept over request rates on a chat workload and a
# long-prompt workload, under the calibrated latency model
# (docs/simulate.md). Writes JSON, Markdown and SVG under $OUT.
#
#   scripts/goodput-study.sh                 # about 25 minutes
#   DURATION=10s scripts/goodput-study.sh    # a quicker, noisier look
#   ONLY=long TOPOLOGIES=pd-1p1d scripts/goodput-study.sh   # one workload, one topology
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-docs/benchmarks/goodput}"
DURATION="${DURATION:-30s}"
PROFILE="${PROFILE:-h100-qwen3-omni-30b-a3b}"
PORT="${PORT:-18731}"
SEED=7

# Workloads: name, prompt words, output tokens, rates, SLO. The reference
# tokenizer spells a random English word as about 5.3 tokens (Qwen's own
# tokenizer: about 1), so prompts are given in words: 48 words are ~250
# tokens, 760 words ~4000. bench reports the exact token counts it was
# charged for (usage.prompt_tokens).
WORKLOADS=(
  "chat 48 256 2,4,6,8,10,12,16 ttft=500ms,tpot=25ms"
  "long 760 200 1,2,3,4,6,8,10 ttft=2s,tpot=25ms"
)
# Topologies: a config in docs/benchmarks/ and the serve flags it needs
# (serve splits a config's Thinker unless told --pd=false).
read -r -a TOPOLOGIES <<<"${TOPOLOGIES:-colocated-2x pd-1p1d}"
declare -A SERVE_FLAGS=([colocated-2x]="--pd=false" [pd-1p1d]="")

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
  start_serve "$OUT/$topo.serve.log" --config "docs/benchmarks/$topo.yaml" ${SERVE_FLAGS[$topo]:-} --simulate "$PROFILE"
  grep -E '^stage .* ready at ' "$OUT/$topo.serve.log"
  for w in "${WORKLOADS[@]}"; do
    read -r name words outlen rates slo <<<"$w"
    [[ " ${ONLY:-chat long} " == *" $name "* ]] || continue
    echo "== $topo · $name workload: rates $rates, $DURATION each"
    "$bin" bench --base-url "http://127.0.0.1:$PORT" --seed "$SEED" \
      --input-len "$words" --output-len "$outlen" --sweep "$rates" --duration "$DURATION" \
      --warmup 4 --slo "$slo" \
      --output-json "$OUT/$name-$topo.json" --plot-dir "$OUT/$name-$topo" >"$OUT/$name-$topo.md"
  done
  stop_serve
done

for w in "${WORKLOADS[@]}"; do
  read -r name _ _ _ _ <<<"$w"
  [ -f "$OUT/$name-colocated-2x.json" ] && [ -f "$OUT/$name-pd-1p1d.json" ] || continue
  echo "== comparing: $name workload"
  "$bin" bench compare --title "$name workload" --plot-dir "$OUT/$name-compare" \
    "colocated ×2=$OUT/$name-colocated-2x.json" "PD 1P+1D=$OUT/$name-pd-1p1d.json" | tee "$OUT/$name-compare.md"
done
