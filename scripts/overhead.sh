#!/usr/bin/env bash
# Measures what omnipd's PD path costs over sending the same request straight
# to a decode engine: omnipd serve runs one prefill and one decode worker on
# the zero-cost latency model (--simulate zero), and omnipd bench drives, at
# the same closed-loop concurrencies, (a) the decode worker's own OpenAI API
# and (b) omnipd's API, which prefills on one worker, moves the KV and
# decodes on the other: one client shows the latency the PD path adds,
# CONCURRENCY clients the requests/s each path sustains. The two alternate
# ROUNDS times in one run, so both see the same machine; the ratios are what
# to read, not the absolutes.
# Writes JSON and Markdown under $OUT; docs/benchmarks.md explains them.
#
#   scripts/overhead.sh                      # about 2 minutes
#   CONCURRENCY=64 scripts/overhead.sh
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-docs/benchmarks/overhead}"
CONCURRENCY="${CONCURRENCY:-16}"
PROMPTS="${PROMPTS:-2000}"
ROUNDS="${ROUNDS:-2}"
PORT="${PORT:-18741}"

mkdir -p "$OUT"
tmp="$(mktemp -d)"
bin="$tmp/omnipd"
echo "== building omnipd"
go build -o "$bin" ./cmd/omnipd

# One secret for the deployment, so the bench may call the decode worker too.
export OMNIPD_SECRET="overhead-$RANDOM$RANDOM"
log="$OUT/serve.log"
"$bin" serve --config docs/benchmarks/pd-1p1d.yaml --simulate zero --port "$PORT" >"$log" 2>&1 &
serve_pid=$!
trap 'kill -TERM $serve_pid 2>/dev/null || true; wait $serve_pid 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  sleep 0.5
done
curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null
decode_url="$(sed -n 's/.*thinker-decode-0 ready at \(http:[^ ]*\).*/\1/p' "$log" | head -1)"
[ -n "$decode_url" ] || { echo "no decode worker address in $log" >&2; exit 1; }

run() { # name base-url key
  "$bin" bench --base-url "$2" --api-key "$3" --sweep "1,$CONCURRENCY" --sweep-concurrency --num-prompts "$PROMPTS" \
    --warmup 50 --input-len 32 --output-len 16 --seed 1 --quiet --output-json "$OUT/$1.json" >"$OUT/$1.md"
}
for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r: direct to the decode worker ($decode_url), then omnipd PD, concurrency 1 and $CONCURRENCY"
  run "direct-$r" "$decode_url" "$OMNIPD_SECRET"
  run "pd-$r" "http://127.0.0.1:$PORT" ""
  "$bin" bench compare "direct=$OUT/direct-$r.json" "PD=$OUT/pd-$r.json" | tee "$OUT/compare-$r.md"
done
