#!/usr/bin/env bash
# Measures what omnipd's PD path costs over sending the same request straight
# to a decode engine: omnipd serve runs one prefill and one decode worker on
# the zero-cost latency model (--simulate zero), and omnipd bench drives, at
# the same closed-loop concurrencies, (a) the decode worker's own OpenAI API
# and (b) omnipd's API, which prefills on one worker, moves the KV and
# decodes on the other: one client shows the latency the PD path adds,
# CONCURRENCY clients the requests/s each path sustains. The two alternate
# ROUNDS times in one run, so both see the same machine; the ratios are what
# to read, not the absolutes. Each handshake of the reference connector is
# measured in turn: pull (NIXL-shaped: the decode leg follows the prefill's
# answer and pulls the KV) and push (Mooncake-shaped: both legs at once, the
# prefill pushes the KV when it has it).
# Each round also counts the CPU time every process spends per request at
# CONCURRENCY clients (from /proc, in clock ticks), so what each process of
# the PD path costs can be read apart from how the machine shared it out.
# Writes JSON and Markdown under $OUT; docs/benchmarks.md explains them.
#
# All the processes share the machine's CPUs, so on a small machine the PD
# path, which runs three processes where the direct path runs one, is bound
# by their CPU time together. CPU_BUDGET=C gives each omnipd process (serve,
# prefill worker, decode worker) a cgroup CPU quota of C CPUs instead, and
# the bench BENCH_BUDGET (default: what is left of the machine's CPUs):
# each process then runs as on a CPU of its own, as in a deployment where
# omnipd and each engine have their own, and the slowest process per request
# sets each path's pace. The CPU table then ends with how often each process
# ran out of its quota. It needs root, or a delegated cgroup.
#
#   scripts/overhead.sh                      # two minutes or so, plus the build
#   HANDSHAKES=pull ROUNDS=1 scripts/overhead.sh
#   CONCURRENCY=64 scripts/overhead.sh
#   CPU_BUDGET=0.3 scripts/overhead.sh       # 0.3 of a CPU per process; results in $OUT/budget
set -euo pipefail
cd "$(dirname "$0")/.."

CPU_BUDGET="${CPU_BUDGET:-}"
if [ -n "$CPU_BUDGET" ]; then
  OUT="${OUT:-docs/benchmarks/overhead/budget}"
  BENCH_BUDGET="${BENCH_BUDGET:-$(awk -v n="$(nproc)" -v c="$CPU_BUDGET" 'BEGIN {printf "%.2f", n - 3 * c}')}"
  awk -v b="$BENCH_BUDGET" 'BEGIN {exit !(b >= 0.3)}' || {
    echo "CPU_BUDGET=$CPU_BUDGET leaves the bench $BENCH_BUDGET of $(nproc) CPUs; give it less" >&2
    exit 2
  }
fi
OUT="${OUT:-docs/benchmarks/overhead}"
CONCURRENCY="${CONCURRENCY:-16}"
PROMPTS="${PROMPTS:-2000}"
ROUNDS="${ROUNDS:-5}"
HANDSHAKES="${HANDSHAKES:-pull push}"
PORT="${PORT:-18741}"
CPU_PROMPTS="${CPU_PROMPTS:-4000}"

mkdir -p "$OUT"
tmp="$(mktemp -d)"
bin="$tmp/omnipd"
echo "== building omnipd"
go build -o "$bin" ./cmd/omnipd

# One secret for the deployment, so the bench may call the decode worker too.
export OMNIPD_SECRET="overhead-$RANDOM$RANDOM"
# shellcheck source=scripts/lib/serve.sh
. scripts/lib/serve.sh
# shellcheck source=scripts/lib/cpubudget.sh
. scripts/lib/cpubudget.sh
trap 'stop_serve; budget_cleanup' EXIT
if [ -n "$CPU_BUDGET" ]; then
  budget_setup omnipd-overhead
  for g in serve prefill decode; do budget_group "$g" "$CPU_BUDGET"; done
  budget_group bench "$BENCH_BUDGET"
  echo "== CPU budgets: $CPU_BUDGET of a CPU for each omnipd process, $BENCH_BUDGET for the bench ($budget_dir)"
fi
# bench ARGS...: omnipd bench, in its budget if there are budgets.
bench() { ( if [ -n "$CPU_BUDGET" ]; then budget_enter bench; fi; exec "$bin" bench "$@" ); }

calls() { awk '/^sysc[rw]:/ {n += $2} END {print n}' "/proc/$1/io"; } # read and write system calls so far
busy() { awk '$1 == "cpu" {print $2 + $3 + $4}' /proc/stat; } # user + nice + system time of the whole machine
hz="$(getconf CLK_TCK)"

# cpu NAME BASE-URL KEY: closed loop at CONCURRENCY, CPU_PROMPTS requests;
# appends a row of CPU µs per request for each process to $OUT/cpu-$hs.md,
# and for the machine's other work in the same time: anything well above
# zero there means something else competed for the CPUs, and the run's
# requests/s are not comparable with a quiet run's. The row ends with each
# process's read and write system calls per request (from /proc/PID/io).
cpu() {
  local pids=("$serve_pid" "$prefill_pid" "$decode_pid") before=() after=() calls0=() calls1=() p bench rps busy0 busy1 throttled0 throttled=""
  busy0="$(busy)"
  for p in "${pids[@]}"; do before+=("$(ticks "$p")") calls0+=("$(calls "$p")"); done
  throttled0="$(throttled)"
  # The subshell reaps the bench, so the bench's CPU time is the subshell's
  # children's, and its system calls are counted in the subshell's own.
  bench="$( ( bench --base-url "$2" --api-key "$3" --concurrency "$CONCURRENCY" --num-prompts "$CPU_PROMPTS" \
      --warmup 50 --input-len 32 --output-len 16 --seed 1 --quiet --output-json "$OUT/cpu-$hs-$1.json" >/dev/null
    awk '{printf "%d ", $16 + $17}' "/proc/$BASHPID/stat"; calls "$BASHPID" ) )"
  for p in "${pids[@]}"; do after+=("$(ticks "$p")") calls1+=("$(calls "$p")"); done
  busy1="$(busy)"
  if [ -n "$CPU_BUDGET" ]; then
    # The share of quota periods each group ran out of its budget in.
    throttled="$(awk -v a="$throttled0" -v b="$(throttled)" 'BEGIN {
      split(a, x); split(b, y)
      for (i = 1; i <= 8; i += 2) { p = y[i + 1] - x[i + 1]; printf "%s%.0f%%", (i > 1 ? " / " : ""), (p > 0 ? 100 * (y[i] - x[i]) / p : 0) } }')"
  fi
  rps="$(sed -n 's/.*"request_throughput_rps": *\([0-9.]*\).*/\1/p' "$OUT/cpu-$hs-$1.json" | head -1)"
  awk -v name="$1" -v n="$((CPU_PROMPTS + 50))" -v hz="$hz" -v rps="$rps" -v bench="${bench% *}" -v bcalls="${bench#* }" \
    -v sc="$((calls1[0] - calls0[0]))" -v pc="$((calls1[1] - calls0[1]))" -v dc="$((calls1[2] - calls0[2]))" \
    -v s0="${before[0]}" -v s1="${after[0]}" -v p0="${before[1]}" -v p1="${after[1]}" -v d0="${before[2]}" -v d1="${after[2]}" \
    -v m0="$busy0" -v m1="$busy1" -v throttled="$throttled" '
    function us(t) { return t * 1e6 / hz / n }
    BEGIN { ours = s1 - s0 + p1 - p0 + d1 - d0 + bench
      other = m1 - m0 - ours; if (other < 0) other = 0
      printf "| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.1f / %.1f / %.1f / %.1f |%s\n", name, rps, us(s1 - s0), us(p1 - p0), us(d1 - d0), us(bench),
      us(ours), us(other), sc / n, pc / n, dc / n, bcalls / n, (throttled == "" ? "" : " " throttled " |") }' | tee -a "$OUT/cpu-$hs.md"
}

# throttled prints, for serve, prefill, decode and bench in turn, "THROTTLED
# PERIODS" of its budget so far (nothing without budgets).
throttled() {
  if [ -n "$CPU_BUDGET" ]; then
    for g in serve prefill decode bench; do budget_throttled "$g"; done | tr '\n' ' '
  fi
}

# summary HANDSHAKE: each round's two figures the targets are about, read
# from its compare-*.md, and their medians over the rounds.
summary() {
  local r rows
  rows="$(for r in $(seq 1 "$ROUNDS"); do
    awk -v r="$r" -v c="$CONCURRENCY" '
      /^\*\*/ { section = $0 }
      section ~ /Request throughput/ && $2 == c { ratio = $8; sub(/×/, "", ratio) }
      section ~ /E2E p50/ && $2 == 1 { added = $6 - $4 }
      END { printf "%s %.2f %.2f\n", r, ratio, added }' "$OUT/compare-$1-$r.md"
  done)"
  median() { sort -n | awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
  printf '%s, %d rounds: PD / direct requests/s at %d clients, and the E2E p50 PD adds at 1 client\n\n' "$1" "$ROUNDS" "$CONCURRENCY"
  printf '| round | PD / direct | added at p50 |\n|---:|---:|---:|\n'
  echo "$rows" | awk '{ printf "| %d | %.2f× | %+.2f ms |\n", $1, $2, $3 }'
  printf '| median | %.2f× | %+.2f ms |\n' "$(echo "$rows" | awk '{print $2}' | median)" "$(echo "$rows" | awk '{print $3}' | median)"
}

run() { # name base-url key
  bench --base-url "$2" --api-key "$3" --sweep "1,$CONCURRENCY" --sweep-concurrency --num-prompts "$PROMPTS" \
    --warmup 50 --input-len 32 --output-len 16 --seed 1 --quiet --output-json "$OUT/$1.json" >"$OUT/$1.md"
}
for hs in $HANDSHAKES; do
  case "$hs" in
    pull) config=docs/benchmarks/pd-1p1d.yaml ;;
    push) config=docs/benchmarks/pd-1p1d-push.yaml ;;
    *) echo "unknown handshake $hs (want pull or push)" >&2; exit 2 ;;
  esac
  log="$OUT/serve-$hs.log"
  start_serve "$log" --config "$config" --simulate zero
  decode_url="$(worker_url thinker-decode-0 "$log")"
  workers="$(worker_pids)" # fails the script when a worker is missing
  read -r prefill_pid decode_pid <<<"$workers"
  head='| path | req/s | omnipd serve | prefill worker | decode worker | bench client | all | other work on the machine | reads and writes: serve / prefill / decode / bench |'
  rule='|---|---:|---:|---:|---:|---:|---:|---:|---:|'
  if [ -n "$CPU_BUDGET" ]; then
    budget_move serve "$serve_pid"
    budget_move prefill "$prefill_pid"
    budget_move decode "$decode_pid"
    head="$head periods out of budget: serve / prefill / decode / bench |"
    rule="$rule---:|"
  fi
  printf '%s\n%s\n' "$head" "$rule" >"$OUT/cpu-$hs.md"
  for r in $(seq 1 "$ROUNDS"); do
    echo "== $hs, round $r: direct to the decode worker ($decode_url), then omnipd PD, concurrency 1 and $CONCURRENCY"
    run "direct-$hs-$r" "$decode_url" "$OMNIPD_SECRET"
    run "pd-$hs-$r" "http://127.0.0.1:$PORT" ""
    "$bin" bench compare "direct=$OUT/direct-$hs-$r.json" "PD=$OUT/pd-$hs-$r.json" | tee "$OUT/compare-$hs-$r.md"
    echo "== $hs, round $r: CPU µs per request at $CONCURRENCY clients ($OUT/cpu-$hs.md)"
    cpu "direct-$r" "$decode_url" "$OMNIPD_SECRET"
    cpu "PD-$r" "http://127.0.0.1:$PORT" ""
  done
  stop_serve
  summary "$hs" | tee "$OUT/summary-$hs.md"
done
