#!/usr/bin/env bash
# Compares the PD path's overhead between two revisions of omnipd in one run:
# for each revision in turn, ROUNDS times, it serves $CONFIG (default
# docs/benchmarks/pd-1p1d.yaml, the pull handshake) on zero-cost engines and measures, as scripts/overhead.sh does, the direct
# path and the PD path at 1 client (E2E p50) and at 16 clients (requests/s).
# The revisions alternate, so both see the same machine; read the ratios.
# Each row ends with the CPU time omnipd serve and each worker spent per PD
# request at 16 clients, as a multiple of the bench client's: the bench is
# the first revision's binary in every run, so its work per request is the
# same, and a machine that runs slower for a while slows it alike. These
# ratios vary far less between rounds than requests/s or µs do on a shared
# machine, and show which process a change made cheaper.
#
#   scripts/overhead-compare.sh 81cfa04 HEAD     # about 2 minutes, plus two builds
#   ROUNDS=5 scripts/overhead-compare.sh A B
#   CONFIG=docs/benchmarks/pd-1p1d-push.yaml scripts/overhead-compare.sh A B   # the push handshake
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: $0 REVISION REVISION" >&2; exit 2; }

ROUNDS="${ROUNDS:-3}"
CONFIG="${CONFIG:-docs/benchmarks/pd-1p1d.yaml}"
PROMPTS="${PROMPTS:-800}"
DURATION="${DURATION:-6s}"
PORT="${PORT:-18742}"
tmp="$(mktemp -d)"
cleanup() {
  stop_serve
  for d in "$tmp"/src-*; do [ -d "$d" ] && git worktree remove --force "$d" >/dev/null 2>&1 || true; done
}
# shellcheck source=scripts/lib/serve.sh
. scripts/lib/serve.sh
trap cleanup EXIT

bins=()
for i in 1 2; do
  rev="${!i}"
  echo "== building $rev"
  git worktree add --detach "$tmp/src-$i" "$rev" >/dev/null 2>&1
  (cd "$tmp/src-$i" && go build -o "$tmp/omnipd-$i" ./cmd/omnipd)
  bins+=("$tmp/omnipd-$i")
done

export OMNIPD_SECRET="compare-$RANDOM$RANDOM"
measure() { # base-url key concurrency -> "req/s e2e-p50-ms"
  local load=(--num-prompts "$PROMPTS")
  [ "$3" = 1 ] || load=(--duration "$DURATION")
  "$bench" bench --base-url "$1" --api-key "$2" --concurrency "$3" "${load[@]}" --warmup 50 --input-len 32 \
    --output-len 16 --seed 1 --quiet --output-json "$tmp/run.json" >/dev/null
  sed -n 's/.*"request_throughput_rps": *\([0-9.]*\).*/\1/p' "$tmp/run.json" | head -1 | tr '\n' ' '
  awk '/"e2e_ms"/ {e=1} e && /"p50"/ {gsub(/[^0-9.]/, "", $2); print $2; exit}' "$tmp/run.json"
}
bench="${bins[0]}"
printf '| revision | round | direct, 1 client | PD, 1 client | added | direct, 16 clients | PD, 16 clients | PD / direct | CPU per PD request ÷ bench\x27s: serve / prefill / decode |\n'
printf '|---|---:|---:|---:|---:|---:|---:|---:|---:|\n'
for r in $(seq 1 "$ROUNDS"); do
  for i in 1 2; do
    bin="${bins[$((i - 1))]}"
    start_serve "$tmp/serve.log" --config "$CONFIG" --simulate zero
    decode_url="$(worker_url thinker-decode-0 "$tmp/serve.log")"
    workers="$(worker_pids)" # fails the script when a worker is missing
    read -r prefill_pid decode_pid <<<"$workers"
    pids=("$serve_pid" "$prefill_pid" "$decode_pid")
    read -r _ d1 <<<"$(measure "$decode_url" "$OMNIPD_SECRET" 1)"
    read -r _ p1 <<<"$(measure "http://127.0.0.1:$PORT" "" 1)"
    read -r d16 _ <<<"$(measure "$decode_url" "$OMNIPD_SECRET" 16)"
    before=(); for p in "${pids[@]}"; do before+=("$(ticks "$p")"); done
    # The subshell reaps the bench, so the bench's CPU time is its children's.
    read -r p16 _ benchticks <<<"$({ measure "http://127.0.0.1:$PORT" "" 16; awk '{print $16 + $17}' "/proc/$BASHPID/stat"; } | tr '\n' ' ')"
    after=(); for p in "${pids[@]}"; do after+=("$(ticks "$p")"); done
    stop_serve
    awk -v rev="${!i}" -v r="$r" -v d1="$d1" -v p1="$p1" -v d16="$d16" -v p16="$p16" -v b="$benchticks" \
      -v s="$((after[0] - before[0]))" -v pf="$((after[1] - before[1]))" -v dc="$((after[2] - before[2]))" 'BEGIN {
      printf "| %s | %d | %.2f ms | %.2f ms | +%.2f ms | %.0f req/s | %.0f req/s | %.2f× | %.2f / %.2f / %.2f |\n",
        rev, r, d1, p1, p1 - d1, d16, p16, p16 / d16, s / b, pf / b, dc / b }'
  done
done
