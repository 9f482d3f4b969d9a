#!/usr/bin/env bash
# verify-real-stages.sh: check omnipd's PD pipeline on vllm-omni stage workers
# against vllm-omni's own colocated serving of the same checkpoint, on a GPU
# host. See --help and docs/production-stages.md.
set -euo pipefail

prog=verify-real-stages.sh
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

model=${OMNIPD_VERIFY_MODEL:-Qwen/Qwen3-Omni-30B-A3B-Instruct}
served_name=${OMNIPD_VERIFY_SERVED_MODEL_NAME:-}
deploy=${OMNIPD_VERIFY_DEPLOY_CONFIG:-$repo/deploy/testdata/fixtures/vllm-omni/qwen3_omni_moe.yaml}
connector=${OMNIPD_VERIFY_CONNECTOR:-NixlConnector}
devices=${OMNIPD_VERIFY_DEVICES:-0-2}
out=${OMNIPD_VERIFY_OUT:-}
omnipd_bin=${OMNIPD_VERIFY_OMNIPD:-}
load_timeout=${OMNIPD_VERIFY_LOAD_TIMEOUT:-3600}
serve_timeout=${OMNIPD_VERIFY_SERVE_TIMEOUT:-600}
request_timeout=${OMNIPD_VERIFY_REQUEST_TIMEOUT:-900}
stop_timeout=${OMNIPD_VERIFY_STOP_TIMEOUT:-60}
# How often a wait looks again: a model load takes minutes, so every 5 s.
poll=${OMNIPD_VERIFY_POLL_SECONDS:-5}
vllm_port=${OMNIPD_VERIFY_VLLM_PORT:-8091}
omnipd_port=${OMNIPD_VERIFY_OMNIPD_PORT:-8000}
base_port=${OMNIPD_VERIFY_BASE_PORT:-8100}
max_tokens=${OMNIPD_VERIFY_MAX_TOKENS:-48}
seed=${OMNIPD_VERIFY_SEED:-42}

usage() {
	cat <<EOF
Usage: scripts/verify-real-stages.sh [options]

On a host with NVIDIA GPUs, vLLM with vllm-omni, and the Qwen3-Omni checkpoint,
send the same seeded requests to
  A. vllm-omni's own colocated pipeline: vllm serve MODEL --omni --deploy-config
     CONFIG (every request twice, to learn whether vllm-omni repeats itself), and
  B. omnipd's PD pipeline: the script that omnipd plan --target vllm --pd prints
     for CONFIG (a vllm-omni stage worker per stage instance), behind omnipd serve,
and report, per request, whether B's text is identical to A's and its audio
equal sample for sample. Where A differs from itself, it reports how close B
is: token edit distance for text (the checkpoint's tokenizer, else words),
max |sample difference| and SNR in dB for audio.

The requests: text only; text+audio out, whole and streamed; an audio prompt
(a generated WAV tone) and an image prompt (a generated PNG). A and B run one
after the other, never at once, on the same GPUs.

It checks its prerequisites first and stops at the first one missing, naming
it: python3, omnipd (or go, to build it), curl, setsid, vllm, vllm_omni importable by
python3, vllm serve --omni, nvidia-smi and enough GPUs, the checkpoint (a
directory, the Hugging Face cache, or reachable on the Hub), free ports.
Every process it starts is stopped when it ends (Ctrl-C included); its logs,
the requests, the answers and the report stay in the output directory, which
it prints first.

Options (each also an environment variable):
  --model M               checkpoint: a Hub id or a directory
                          (OMNIPD_VERIFY_MODEL; default $model)
  --served-model-name N   model name both pipelines serve (default: --model)
  --deploy-config PATH    vllm-omni deploy config for A, planned with --pd for B
                          (OMNIPD_VERIFY_DEPLOY_CONFIG; default
                          deploy/testdata/fixtures/vllm-omni/qwen3_omni_moe.yaml)
  --connector NAME        vLLM KV connector between prefill and decode
                          (OMNIPD_VERIFY_CONNECTOR; default $connector)
  --devices LIST          GPUs of B's layout, e.g. 0-2 or 0,1,2
                          (OMNIPD_VERIFY_DEVICES; default $devices)
  --omnipd PATH           omnipd binary (OMNIPD_VERIFY_OMNIPD; default: omnipd
                          on PATH, else built here with go)
  --out DIR               output directory (OMNIPD_VERIFY_OUT; default: a new
                          temporary directory)
  --load-timeout S        how long an engine may take to answer /health; a
                          first start downloads and compiles
                          (OMNIPD_VERIFY_LOAD_TIMEOUT; default $load_timeout)
  --serve-timeout S       how long omnipd serve may take to be ready
                          (OMNIPD_VERIFY_SERVE_TIMEOUT; default $serve_timeout)
  --request-timeout S     bound of one request (OMNIPD_VERIFY_REQUEST_TIMEOUT;
                          default $request_timeout)
  --stop-timeout S        how long a stopped process may take to exit before
                          it is killed (OMNIPD_VERIFY_STOP_TIMEOUT; default $stop_timeout)
                          Waits look again every OMNIPD_VERIFY_POLL_SECONDS ($poll).
  --vllm-port P           port of A (OMNIPD_VERIFY_VLLM_PORT; default $vllm_port)
  --omnipd-port P         port of omnipd serve (OMNIPD_VERIFY_OMNIPD_PORT;
                          default $omnipd_port)
  --base-port P           first port of B's instances (OMNIPD_VERIFY_BASE_PORT;
                          default $base_port)
  --max-tokens N          max_tokens of every request (OMNIPD_VERIFY_MAX_TOKENS;
                          default $max_tokens)
  --seed N                seed of every request (OMNIPD_VERIFY_SEED; default $seed)
  -h, --help              this text

Exit status: 0 every answer equal; 1 a difference where vllm-omni repeats
itself, or a failure; 2 a bad option; 4 differences only where vllm-omni
itself differs run to run (measured in the report).
EOF
}

say() { printf '%s: %s\n' "$prog" "$*"; }
die() {
	printf '%s: %s\n' "$prog" "$*" >&2
	exit 1
}
usage_error() {
	printf '%s: %s (see --help)\n' "$prog" "$*" >&2
	exit 2
}

# optarg prints the value of option $1, which is $2.
optarg() {
	[[ $# -ge 2 ]] || usage_error "$1 needs a value"
	printf '%s' "$2"
}

while (($#)); do
	case $1 in
	-h | --help)
		usage
		exit 0
		;;
	--*=*)
		set -- "${1%%=*}" "${1#*=}" "${@:2}"
		continue
		;;
	--model) model=$(optarg "$@") ;;
	--served-model-name) served_name=$(optarg "$@") ;;
	--deploy-config) deploy=$(optarg "$@") ;;
	--connector) connector=$(optarg "$@") ;;
	--devices) devices=$(optarg "$@") ;;
	--omnipd) omnipd_bin=$(optarg "$@") ;;
	--out) out=$(optarg "$@") ;;
	--load-timeout) load_timeout=$(optarg "$@") ;;
	--serve-timeout) serve_timeout=$(optarg "$@") ;;
	--request-timeout) request_timeout=$(optarg "$@") ;;
	--stop-timeout) stop_timeout=$(optarg "$@") ;;
	--vllm-port) vllm_port=$(optarg "$@") ;;
	--omnipd-port) omnipd_port=$(optarg "$@") ;;
	--base-port) base_port=$(optarg "$@") ;;
	--max-tokens) max_tokens=$(optarg "$@") ;;
	--seed) seed=$(optarg "$@") ;;
	*) usage_error "unknown option $1" ;;
	esac
	shift 2
done

for pair in "load-timeout=$load_timeout" "serve-timeout=$serve_timeout" \
	"request-timeout=$request_timeout" "stop-timeout=$stop_timeout" \
	"vllm-port=$vllm_port" "omnipd-port=$omnipd_port" "base-port=$base_port" \
	"max-tokens=$max_tokens" "seed=$seed"; do
	[[ ${pair#*=} =~ ^[0-9]+$ ]] || usage_error "--${pair%%=*} ${pair#*=}: want a whole number"
done
[[ -n $model ]] || usage_error "--model is empty"
served_name=${served_name:-$model}

# gpus_needed prints how many GPUs a device list such as 0-2 or 0,2 needs
# visible: its largest index plus one.
gpus_needed() {
	local part parts top=-1 last
	IFS=, read -ra parts <<<"$1"
	for part in "${parts[@]}"; do
		if [[ $part =~ ^([0-9]+)-([0-9]+)$ ]]; then
			last=${BASH_REMATCH[2]}
		elif [[ $part =~ ^[0-9]+$ ]]; then
			last=$part
		else
			usage_error "--devices $1: want a list such as 0-2 or 0,1,2"
		fi
		if ((last > top)); then top=$last; fi
	done
	((top >= 0)) || usage_error "--devices is empty"
	echo $((top + 1))
}
gpus=$(gpus_needed "$devices")

[[ -f $deploy ]] || die "deploy config $deploy not found (--deploy-config)"

# --- Prerequisites, in order; the first missing one ends the run. ---

command -v python3 >/dev/null 2>&1 ||
	die "python3 is not on PATH: this script builds the requests and compares the answers with it"

build_omnipd=
if [[ -n $omnipd_bin ]]; then
	[[ -x $omnipd_bin ]] || die "omnipd binary $omnipd_bin (--omnipd) is not an executable file"
elif command -v omnipd >/dev/null 2>&1; then
	omnipd_bin=$(command -v omnipd)
elif command -v go >/dev/null 2>&1; then
	build_omnipd=1
else
	die "neither omnipd nor go is on PATH: build it (go build -o omnipd ./cmd/omnipd) and pass --omnipd PATH"
fi

command -v curl >/dev/null 2>&1 || die "curl is not on PATH: this script sends the requests with it"
command -v setsid >/dev/null 2>&1 ||
	die "setsid (util-linux) is not on PATH: this script starts each server in a session of its own, to stop all it started"

command -v vllm >/dev/null 2>&1 ||
	die "vllm is not on PATH: install vLLM and vllm-omni (pip install vllm-omni), or activate their environment"

python3 -c 'import vllm_omni' >/dev/null 2>&1 ||
	die "python3 ($(command -v python3)) cannot import vllm_omni: install vllm-omni into the environment vllm runs from (pip install vllm-omni)"

# vllm serve --omni exists only where vllm-omni extends vLLM's CLI.
omni_help=$({ timeout 300 vllm serve --help=all 2>&1 || true; })
if ! grep -q -- '--omni' <<<"$omni_help"; then
	omni_help=$({ timeout 300 vllm serve --help 2>&1 || true; })
	grep -q -- '--omni' <<<"$omni_help" ||
		die "vllm ($(command -v vllm)) has no serve --omni: it is not the vllm that vllm-omni extends; install vllm-omni into its environment"
fi

command -v nvidia-smi >/dev/null 2>&1 ||
	die "nvidia-smi is not on PATH: this check runs on NVIDIA GPUs, with their driver installed"
seen=$({ nvidia-smi -L 2>/dev/null || true; } | grep -c '^GPU ' || true)
((seen >= gpus)) ||
	die "nvidia-smi lists ${seen} GPU(s); --devices $devices needs ${gpus}"

# The checkpoint: a directory, the Hugging Face cache, or the Hub.
if [[ -d $model ]]; then
	[[ -f $model/config.json ]] || die "checkpoint directory $model has no config.json"
elif [[ $model == /* || $model == .* ]]; then
	die "checkpoint directory $model not found (--model)"
else
	hub=${HF_HUB_CACHE:-${HF_HOME:-$HOME/.cache/huggingface}/hub}
	if ! compgen -G "$hub/models--${model//\//--}/snapshots/*/config.json" >/dev/null; then
		[[ ${HF_HUB_OFFLINE:-0} != 1 ]] ||
			die "checkpoint $model is not in the Hugging Face cache ($hub) and HF_HUB_OFFLINE=1 forbids downloading it"
		rc=0
		timeout 60 python3 - "$model" <<'PY' >/dev/null 2>&1 || rc=$?
import sys
try:
    from huggingface_hub import HfApi
except ImportError:
    sys.exit(3)
HfApi().model_info(sys.argv[1], timeout=30)
PY
		case $rc in
		0) say "checkpoint $model is not cached yet: vllm downloads it on first start (bounded by --load-timeout)" ;;
		3) die "checkpoint $model is not in the Hugging Face cache ($hub), and python3 has no huggingface_hub to look it up" ;;
		*) die "checkpoint $model is not in the Hugging Face cache ($hub) nor reachable on the Hub (a gated model needs HF_TOKEN)" ;;
		esac
	fi
fi

# port_free succeeds when 127.0.0.1:$1 can be bound.
port_free() {
	python3 - "$1" <<'PY'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
PY
}
for pair in "vllm-port=$vllm_port" "omnipd-port=$omnipd_port" "base-port=$base_port"; do
	port_free "${pair#*=}" || die "port ${pair#*=} (--${pair%%=*}) is in use; choose another"
done
[[ $vllm_port != "$omnipd_port" ]] || usage_error "--vllm-port and --omnipd-port are both $vllm_port"

# --- From here on, processes start: each is stopped when the script ends. ---

if [[ -z $out ]]; then
	out=$(mktemp -d "${TMPDIR:-/tmp}/verify-real-stages.XXXXXX")
else
	mkdir -p "$out"
	out=$(cd "$out" && pwd)
fi
say "logs, requests, answers and the report: $out"
mkdir -p "$out/requests" "$out/colocated/run1" "$out/colocated/run2" "$out/pd/run"

# Every server starts in a session of its own (setsid), so that stopping its
# process group stops what it started too, while Ctrl-C reaches this script.
groups=()
stop_group() {
	local pid=$1 deadline
	kill -TERM -- "-$pid" 2>/dev/null || return 0
	deadline=$(($(date +%s) + stop_timeout))
	while kill -0 -- "-$pid" 2>/dev/null; do
		if (($(date +%s) >= deadline)); then
			kill -KILL -- "-$pid" 2>/dev/null || true
			break
		fi
		sleep 1
	done
	wait "$pid" 2>/dev/null || true
}
cleanup() {
	local pid
	for pid in "${groups[@]}"; do stop_group "$pid"; done
	groups=()
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# started_pid is the process group of the job started last.
started_pid=
start() {
	local log=$1
	shift
	setsid "$@" >"$log" 2>&1 </dev/null &
	started_pid=$!
	groups+=("$started_pid")
}

# wait_health NAME URL PID LOG TIMEOUT waits until URL/health answers 200.
wait_health() {
	local name=$1 url=$2 pid=$3 log=$4 bound=$5 deadline
	deadline=$(($(date +%s) + bound))
	say "waiting for $name at $url/health (at most ${bound}s; log: $log)"
	until curl -fsS -o /dev/null --max-time 5 "$url/health" 2>/dev/null; do
		if ! kill -0 "$pid" 2>/dev/null; then
			tail -n 30 "$log" >&2 || true
			die "$name exited before it was ready; its log: $log"
		fi
		(($(date +%s) < deadline)) || die "$name not ready within ${bound}s; its log: $log"
		sleep "$poll"
	done
	say "$name ready"
}

# wait_line NAME FILE TEXT PID TIMEOUT waits until FILE has a line with TEXT.
wait_line() {
	local name=$1 file=$2 text=$3 pid=$4 bound=$5 deadline
	deadline=$(($(date +%s) + bound))
	say "waiting for $name (at most ${bound}s; log: $file)"
	until grep -qF -- "$text" "$file" 2>/dev/null; do
		if ! kill -0 "$pid" 2>/dev/null; then
			tail -n 30 "$file" >&2 || true
			die "$name exited before it was ready; its log: $file"
		fi
		(($(date +%s) < deadline)) || die "$name not ready within ${bound}s; its log: $file"
		sleep "$poll"
	done
	say "$name ready"
}

if [[ -n $build_omnipd ]]; then
	say "building omnipd with $(command -v go) (log: $out/build.log)"
	(cd "$repo" && go build -o "$out/omnipd" ./cmd/omnipd) >"$out/build.log" 2>&1 ||
		die "go build of omnipd failed; see $out/build.log"
	omnipd_bin=$out/omnipd
fi

# B's plan first: it is pure and quick, and a refusal should not wait for A.
if ! "$omnipd_bin" plan --target vllm --pd --connector "$connector" --devices "$devices" \
	--model "$model" --served-model-name "$served_name" --host 127.0.0.1 --base-port "$base_port" \
	"$deploy" >"$out/pd/launch.sh" 2>"$out/pd/plan.err"; then
	die "omnipd plan --target vllm --pd cannot plan $deploy: $(grep -m1 . "$out/pd/plan.err" || echo "no reason given")"
fi
while read -r port; do
	if [[ $port == "$omnipd_port" ]]; then
		die "port $port is both omnipd serve's (--omnipd-port) and a planned instance's"
	fi
	port_free "$port" || die "port $port, planned for an instance of B (from --base-port $base_port), is in use"
done < <(grep -oE -- '--port[ =][0-9]+' "$out/pd/launch.sh" | grep -oE '[0-9]+$' | sort -u)

# The requests, the same bytes to both pipelines.
python3 - "$out/requests" "$served_name" "$max_tokens" "$seed" <<'PY'
import base64, json, math, os, struct, sys, wave, io, zlib

outdir, name, max_tokens, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

def tone_wav():
    # One second of 440 Hz at 16 kHz, 16-bit mono.
    rate, buf = 16000, io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1); w.setsampwidth(2); w.setframerate(rate)
        w.writeframes(b"".join(struct.pack("<h", int(9830 * math.sin(2 * math.pi * 440 * i / rate))) for i in range(rate)))
    return base64.b64encode(buf.getvalue()).decode()

def gradient_png(size=32):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    rows = b"".join(b"\x00" + b"".join(bytes((x * 8, y * 8, 128)) for x in range(size)) for y in range(size))
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)) \
        + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    return base64.b64encode(png).decode()

def text(prompt):
    return [{"role": "user", "content": prompt}]

speech = {"modalities": ["text", "audio"], "audio": {"format": "wav"}}
cases = [
    ("text-only", {"messages": text("Name three colors in one short sentence."), "modalities": ["text"]}),
    ("speech-whole", dict(speech, messages=text("Say hello and introduce yourself in one sentence."))),
    ("speech-stream", dict(speech, stream=True, messages=text("Say hello and introduce yourself in one sentence."))),
    ("audio-in", dict(speech, messages=[{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": tone_wav(), "format": "wav"}},
        {"type": "text", "text": "What do you hear? Answer in one sentence."}]}])),
    ("image-in-stream", dict(speech, stream=True, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + gradient_png()}},
        {"type": "text", "text": "Describe this picture in one sentence."}]}])),
]
with open(os.path.join(outdir, "cases"), "w") as index:
    for case, body in cases:
        body = dict(body, model=name, max_tokens=max_tokens, temperature=0.0, seed=seed)
        with open(os.path.join(outdir, case + ".json"), "w") as f:
            json.dump(body, f)
        index.write(case + "\n")
PY
mapfile -t cases <"$out/requests/cases"

# send_all URL DIR sends every request to URL, each answer to DIR/CASE.out
# and its HTTP status to DIR/CASE.status.
send_all() {
	local url=$1 dir=$2 case code
	for case in "${cases[@]}"; do
		code=$(curl -sS -N --max-time "$request_timeout" -H 'Content-Type: application/json' \
			--data-binary "@$out/requests/$case.json" -o "$dir/$case.out" -w '%{http_code}' \
			"$url/v1/chat/completions" 2>"$dir/$case.err" || true)
		echo "${code:-000}" >"$dir/$case.status"
		say "  $case: HTTP ${code:-000}"
	done
}

# --- A: vllm-omni colocated, every request twice. ---
start "$out/colocated/vllm.log" vllm serve "$model" --omni --host 127.0.0.1 --port "$vllm_port" \
	--served-model-name "$served_name" --deploy-config "$deploy"
wait_health "vllm serve --omni" "http://127.0.0.1:$vllm_port" "$started_pid" "$out/colocated/vllm.log" "$load_timeout"
say "A, first run"
send_all "http://127.0.0.1:$vllm_port" "$out/colocated/run1"
say "A, second run"
send_all "http://127.0.0.1:$vllm_port" "$out/colocated/run2"
say "stopping A"
cleanup

# --- B: omnipd's plan on stage workers, omnipd serve in front. ---
export PYTHONPATH="$repo/vllm-omni-stage${PYTHONPATH:+:$PYTHONPATH}"
# The plan's script and omnipd serve run in $out/pd, where the plan's files go;
# the directory is sh -c's $1, expanded there, not here.
# shellcheck disable=SC2016
start "$out/pd/launch.log" sh -c 'cd "$1" && exec sh launch.sh' sh "$out/pd"
launch_pid=$started_pid
wait_line "the planned instances" "$out/pd/launch.log" "every instance is ready" "$launch_pid" "$load_timeout"
# shellcheck disable=SC2016
start "$out/pd/serve.log" sh -c 'cd "$1" && shift && exec "$@"' sh "$out/pd" \
	"$omnipd_bin" serve --config omnipd-vllm.yaml --secret-file omnipd-secret \
	--served-model-name "$served_name" --host 127.0.0.1 --port "$omnipd_port"
wait_health "omnipd serve" "http://127.0.0.1:$omnipd_port" "$started_pid" "$out/pd/serve.log" "$serve_timeout"
say "B"
send_all "http://127.0.0.1:$omnipd_port" "$out/pd/run"
say "stopping B"
cleanup

# --- The comparison. ---
cat >"$out/compare.py" <<'PY'
import base64, io, json, math, os, sys, wave

out, model = sys.argv[1], sys.argv[2]
cases = [c for c in open(os.path.join(out, "requests", "cases")).read().split() if c]

def wav_samples(data):
    with wave.open(io.BytesIO(data)) as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise ValueError("audio is not 16-bit mono WAV")
        raw = w.readframes(w.getnframes())
    return [int.from_bytes(raw[i:i + 2], "little", signed=True) for i in range(0, len(raw), 2)]

def answer(dirname, case):
    """(text, samples, error) of one answer, whole or streamed."""
    status = open(os.path.join(dirname, case + ".status")).read().strip()
    raw = open(os.path.join(dirname, case + ".out"), encoding="utf-8", errors="replace").read() \
        if os.path.exists(os.path.join(dirname, case + ".out")) else ""
    if status != "200":
        return "", [], "HTTP %s: %s" % (status, raw.strip()[:200])
    text, audio = [], []
    try:
        if raw.lstrip().startswith("{"):
            for choice in json.loads(raw).get("choices", []):
                msg = choice.get("message") or {}
                if isinstance(msg.get("content"), str):
                    text.append(msg["content"])
                if (msg.get("audio") or {}).get("data"):
                    audio += wav_samples(base64.b64decode(msg["audio"]["data"]))
        else:
            for line in raw.splitlines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    return "", [], "stream error: %s" % event["error"]
                for choice in event.get("choices", []):
                    content = (choice.get("delta") or {}).get("content")
                    if not content:
                        continue
                    if event.get("modality") == "audio":
                        audio += wav_samples(base64.b64decode(content))
                    else:
                        text.append(content)
    except (ValueError, KeyError) as e:
        return "", [], "unreadable answer: %s" % e
    return "".join(text), audio, None

try:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model, trust_remote_code=True)
    tokens, unit = (lambda s: tok.encode(s, add_special_tokens=False)), "tokens"
except Exception:
    tokens, unit = (lambda s: s.split()), "words"

def edit_distance(a, b):
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]

def text_cmp(a, b):
    if a == b:
        return True, "identical (%d %s)" % (len(tokens(a)), unit)
    ta, tb = tokens(a), tokens(b)
    return False, "differs: edit distance %d of %d %s" % (edit_distance(ta, tb), max(len(ta), 1), unit)

def audio_cmp(a, b):
    if a == b:
        return True, "equal sample for sample (%d samples)" % len(a)
    n = min(len(a), len(b))
    if n == 0:
        return False, "differs: %d vs %d samples" % (len(a), len(b))
    diff = [a[i] - b[i] for i in range(n)]
    err = sum(d * d for d in diff)
    sig = sum(a[i] * a[i] for i in range(n))
    snr = "inf" if err == 0 else ("%.1f" % (10 * math.log10(sig / err)) if sig else "-inf")
    return False, "differs: max |diff| %.5f, SNR %s dB over %d common samples, %d vs %d samples" % (
        max(abs(d) for d in diff) / 32768.0, snr, n, len(a), len(b))

lines, results, worst = [], {}, 0
for case in cases:
    wants_audio = "audio" in json.load(open(os.path.join(out, "requests", case + ".json"))).get("modalities", [])
    a1 = answer(os.path.join(out, "colocated", "run1"), case)
    a2 = answer(os.path.join(out, "colocated", "run2"), case)
    b = answer(os.path.join(out, "pd", "run"), case)
    errors = ["%s: %s" % (who, r[2]) for who, r in (("A1", a1), ("A2", a2), ("B", b)) if r[2]]
    if not errors and wants_audio:
        errors = ["%s: no audio" % who for who, r in (("A1", a1), ("A2", a2), ("B", b)) if not r[1]]
    if errors:
        verdict, detail = "ERROR", "; ".join(errors)
    else:
        rep_text, rep_text_msg = text_cmp(a1[0], a2[0])
        rep_audio, rep_audio_msg = audio_cmp(a1[1], a2[1])
        eq_text, eq_text_msg = text_cmp(a1[0], b[0])
        eq_audio, eq_audio_msg = audio_cmp(a1[1], b[1])
        if eq_text and eq_audio:
            verdict = "EQUAL"
        elif (not eq_text and rep_text) or (not eq_audio and rep_audio):
            verdict = "DIFFERENT"
        else:
            verdict = "INCONCLUSIVE"
        detail = "text %s" % eq_text_msg
        if wants_audio:
            detail += "; audio %s" % eq_audio_msg
        if not (rep_text and rep_audio):
            detail += " | vllm-omni run to run: text %s" % rep_text_msg
            if wants_audio:
                detail += "; audio %s" % rep_audio_msg
    worst = max(worst, {"EQUAL": 0, "INCONCLUSIVE": 1, "DIFFERENT": 2, "ERROR": 2}[verdict])
    results[case] = {"verdict": verdict, "detail": detail}
    lines.append("%-16s %-12s %s" % (case, verdict, detail))

report = "\n".join(lines) + "\n"
open(os.path.join(out, "report.txt"), "w").write(report)
json.dump(results, open(os.path.join(out, "report.json"), "w"), indent=2)
sys.stdout.write(report)
sys.exit({0: 0, 1: 4, 2: 1}[worst])
PY
say "report (B against A's first run; also in $out/report.txt):"
rc=0
python3 "$out/compare.py" "$out" "$model" || rc=$?
case $rc in
0) say "every answer of omnipd's PD pipeline equals vllm-omni's colocated one" ;;
4) say "differences only where vllm-omni differs from itself run to run; see the measures above" ;;
*) say "omnipd's PD pipeline differs from vllm-omni's colocated one (or a request failed); logs in $out" ;;
esac
exit "$rc"
