#!/usr/bin/env bash
# Measures what async chunk buys a streamed spoken answer: audio time to
# first packet (TTFP), text TTFT and audio RTF, with async chunk on and off,
# the Thinker colocated and split into prefill and decode, at concurrency 1
# and 8, under the calibrated latency model (docs/simulate.md). The four
# serves run side by side on loopback and every round benches each of them
# in turn (the order rotating), so a noisy machine slows every arm alike.
# Writes each run's Markdown and JSON and a summary (summary.md,
# summary.json) under $OUT. About 8 minutes on 2 cores.
#
#   scripts/async-chunk-study.sh
#   ROUNDS=1 scripts/async-chunk-study.sh    # a quicker, noisier look
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-docs/benchmarks/async-chunk}"
PROFILE="${PROFILE:-h100-qwen3-omni-30b-a3b}"
PORT="${PORT:-18761}" # the first port tried; the next free ones are taken
ROUNDS="${ROUNDS:-2}"
INPUT_LEN="${INPUT_LEN:-48}" # words: about 250 reference tokens
OUTPUT_LEN="${OUTPUT_LEN:-256}"
# Requests per round at each concurrency: one per client at 8, so every
# round starts eight answers together.
declare -A PROMPTS=([1]="${PROMPTS_C1:-2}" [8]="${PROMPTS_C8:-8}")
CONCURRENCIES=(1 8)
SEED=11

# Arms: name and the serve flags that make it.
ARMS=(colocated-async colocated-sync pd-async pd-sync)
declare -A ARM_FLAGS=(
  [colocated-async]="--pd=false --async-chunk=true"
  [colocated-sync]="--pd=false --async-chunk=false"
  [pd-async]="--async-chunk=true"
  [pd-sync]="--async-chunk=false"
)

mkdir -p "$OUT"
tmp="$(mktemp -d)"
bin="$tmp/omnipd"
echo "== building omnipd"
go build -o "$bin" ./cmd/omnipd
export OMNIPD_SECRET="async-chunk-$RANDOM$RANDOM"

# free_port FROM prints the first port from FROM on that nothing on
# loopback answers (serve binds it before any worker starts, so a port
# taken in between fails at once).
free_port() {
  local p
  for p in $(seq "$1" $(($1 + 200))); do
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
  done
  echo "no free port in $1..$(($1 + 200))" >&2
  return 1
}

declare -A SERVE_PID ARM_PORT
stop_all() {
  local arm
  for arm in "${!SERVE_PID[@]}"; do kill -TERM "${SERVE_PID[$arm]}" 2>/dev/null || true; done
  for arm in "${!SERVE_PID[@]}"; do wait "${SERVE_PID[$arm]}" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap stop_all EXIT

next=$PORT
for arm in "${ARMS[@]}"; do
  ARM_PORT[$arm]="$(free_port "$next")"
  next=$((ARM_PORT[$arm] + 1))
  echo "== $arm: omnipd serve ${ARM_FLAGS[$arm]} --simulate $PROFILE on port ${ARM_PORT[$arm]}"
  # shellcheck disable=SC2086 # the flags are words
  "$bin" serve ${ARM_FLAGS[$arm]} --simulate "$PROFILE" --port "${ARM_PORT[$arm]}" >"$OUT/$arm.serve.log" 2>&1 &
  SERVE_PID[$arm]=$!
done
for arm in "${ARMS[@]}"; do
  for _ in $(seq 1 240); do
    curl -fsS "http://127.0.0.1:${ARM_PORT[$arm]}/health" >/dev/null 2>&1 && break
    kill -0 "${SERVE_PID[$arm]}" 2>/dev/null || { echo "serve $arm exited:" >&2; tail "$OUT/$arm.serve.log" >&2; exit 1; }
    sleep 0.5
  done
  curl -fsS "http://127.0.0.1:${ARM_PORT[$arm]}/health" >/dev/null
done

started=$SECONDS
for round in $(seq 1 "$ROUNDS"); do
  for c in "${CONCURRENCIES[@]}"; do
    # Rotate the order each round and concurrency: a different arm goes first.
    shift_by=$(((round - 1) * ${#CONCURRENCIES[@]} + (c == 1 ? 0 : 1)))
    for i in $(seq 0 $((${#ARMS[@]} - 1))); do
      arm="${ARMS[$(((i + shift_by) % ${#ARMS[@]}))]}"
      name="$arm-c$c-r$round"
      echo "== round $round/$ROUNDS · $arm · concurrency $c · ${PROMPTS[$c]} requests ($((SECONDS - started)) s in)"
      "$bin" bench --base-url "http://127.0.0.1:${ARM_PORT[$arm]}" --seed "$SEED" \
        --modalities text,audio --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" \
        --concurrency "$c" --num-prompts "${PROMPTS[$c]}" --warmup "$([ "$round" = 1 ] && echo 1 || echo 0)" \
        --timeout 3m --output-json "$OUT/$name.json" >"$OUT/$name.md"
    done
  done
done
echo "== benched in $((SECONDS - started)) s"

# The summary pools each arm's requests over the rounds. Percentiles
# interpolate linearly between the sorted values (as bench's own do).
{
  for c in "${CONCURRENCIES[@]}"; do
    for arm in "${ARMS[@]}"; do
      jq -c --arg arm "$arm" --argjson c "$c" '[.runs[].requests[]] | {arm: $arm, concurrency: $c, requests: .}' "$OUT/$arm-c$c-r"*.json
    done
  done
} | jq -s '
  def pct(p): sort as $s | ($s | length) as $n
    | if $n == 0 then null else (($n - 1) * p) as $r | ($r | floor) as $lo
      | $s[$lo] + (($s[[$lo + 1, $n - 1] | min] - $s[$lo]) * ($r - $lo)) end;
  def stat(f): [.[] | f | select(. != null)] | {p50: pct(0.5), p99: pct(0.99)};
  group_by([.concurrency, .arm]) | map({arm: .[0].arm, concurrency: .[0].concurrency, requests: [.[].requests[]]})
  | map(. as $a | ($a.requests | map(select(.success))) as $ok | {
      arm, concurrency,
      completed: ($ok | length), failed: (($a.requests | length) - ($ok | length)),
      prompt_tokens_mean: (if ($ok | length) > 0 then ([$ok[].prompt_tokens] | add / length) else null end),
      audio_ttfp_ms: ($ok | stat(.audio_ttfp_ms)), ttft_ms: ($ok | stat(.ttft_ms)),
      audio_rtf: ($ok | stat(.audio_rtf)), e2e_ms: ($ok | stat(.e2e_ms))})' >"$OUT/summary.json"

jq -r --arg profile "$PROFILE" --argjson rounds "$ROUNDS" --arg in "$INPUT_LEN" --arg out "$OUTPUT_LEN" '
  def f(x): if x == null then "–" else (x * 10 | round / 10 | tostring) end;
  def r(x): if x == null then "–" else (x * 1000 | round / 1000 | tostring) end;
  "Streamed spoken answers (`--modalities text,audio`), \($in)-word prompts, \($out)-token answers, `--simulate \($profile)`, \($rounds) rounds; closed loop.\n",
  "| arm | concurrency | requests (failed) | audio TTFP p50 | audio TTFP p99 | text TTFT p50 | text TTFT p99 | RTF p50 | RTF p99 |",
  "|---|---|---|---|---|---|---|---|---|",
  (.[] | "| \(.arm) | \(.concurrency) | \(.completed) (\(.failed)) | \(f(.audio_ttfp_ms.p50)) ms | \(f(.audio_ttfp_ms.p99)) ms | \(f(.ttft_ms.p50)) ms | \(f(.ttft_ms.p99)) ms | \(r(.audio_rtf.p50)) | \(r(.audio_rtf.p99)) |")
' "$OUT/summary.json" | tee "$OUT/summary.md"
