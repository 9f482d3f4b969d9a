# Shared by the benchmark scripts: start `omnipd serve` in the background and
# wait until it is ready, and stop it again. Source it; it expects $bin (the
# omnipd binary) and $PORT.

serve_pid=""

# start_serve LOG ARGS...: runs `$bin serve ARGS... --port $PORT` with its
# output in LOG, sets serve_pid, and returns once /health answers (or fails
# after a minute).
start_serve() {
  local log=$1
  shift
  "$bin" serve "$@" --port "$PORT" >"$log" 2>&1 &
  serve_pid=$!
  for _ in $(seq 1 120); do
    curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null
}

# stop_serve stops the serve started last, if any, and waits for it (and so
# for its workers) to exit.
stop_serve() {
  if [ -n "$serve_pid" ]; then
    kill -TERM "$serve_pid" 2>/dev/null || true
    wait "$serve_pid" 2>/dev/null || true
    serve_pid=""
  fi
}

# worker_url NAME LOG prints the base URL of the worker NAME (thinker-decode-0,
# say) as serve logged it in LOG, and fails if it is not there.
worker_url() {
  local url
  url="$(sed -n "s/.* $1 ready at \(http:[^ ]*\).*/\1/p" "$2" | head -1)"
  [ -n "$url" ] || { echo "no address of worker $1 in $2" >&2; return 1; }
  echo "$url"
}

# worker_pids prints the process ids of the serve started last's prefill and
# decode workers ("PREFILL DECODE"), and fails if either is missing.
worker_pids() {
  local p prefill="" decode=""
  for p in $(pgrep -P "$serve_pid"); do
    case "$(tr '\0' ' ' <"/proc/$p/cmdline")" in
      *thinker-prefill*) prefill=$p ;;
      *thinker-decode*) decode=$p ;;
    esac
  done
  [ -n "$prefill" ] && [ -n "$decode" ] || { echo "no worker processes under omnipd serve ($serve_pid)" >&2; return 1; }
  echo "$prefill $decode"
}

# ticks PID prints the CPU time (user + system, in clock ticks) a running
# process has spent so far.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
