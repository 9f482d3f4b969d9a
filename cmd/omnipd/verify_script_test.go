package main

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// verifyScript is the check a GPU owner runs against vllm-omni's own serving.
const verifyScript = repoRoot + "/scripts/verify-real-stages.sh"

// verifyRunBound bounds one run of the script: its prerequisite checks end it
// at once, so a run this long is stuck.
const verifyRunBound = 2 * time.Minute

// verifyHost is a machine without GPUs, as the script sees it: a PATH of the
// system tools it needs and of stubs added one by one, an empty HOME.
type verifyHost struct {
	t          *testing.T
	bin        string // the whole PATH
	home       string
	pythonPath string
	env        []string
	calls      string // where the vllm stub records its arguments
}

func newVerifyHost(t *testing.T) *verifyHost {
	t.Helper()
	h := &verifyHost{t: t, bin: t.TempDir(), home: t.TempDir()}
	h.calls = filepath.Join(t.TempDir(), "vllm-calls")
	for _, tool := range []string{"bash", "env", "dirname", "grep", "sed", "tr", "head", "sort", "cat", "mkdir", "mktemp", "timeout", "date", "sleep"} {
		path, err := exec.LookPath(tool)
		if err != nil {
			t.Skipf("%s is not on this machine's PATH: %v", tool, err)
		}
		h.link(tool, path)
	}
	// python3 may be a shim that needs more of PATH: link the interpreter itself.
	out, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		t.Skipf("no python3 here: %v", err)
	}
	h.link("python3", strings.TrimSpace(string(out)))
	return h
}

func (h *verifyHost) link(name, target string) {
	h.t.Helper()
	if err := os.Symlink(target, filepath.Join(h.bin, name)); err != nil {
		h.t.Fatal(err)
	}
}

// stub puts an executable NAME on the PATH that runs the sh script body.
func (h *verifyHost) stub(name, body string) {
	h.t.Helper()
	if err := os.WriteFile(filepath.Join(h.bin, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		h.t.Fatal(err)
	}
}

// run runs the script as a user would, with the host's PATH and HOME.
func (h *verifyHost) run(args ...string) (code int, stdout, stderr string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), verifyRunBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, verifyScript, args...)
	cmd.Env = append([]string{"PATH=" + h.bin, "HOME=" + h.home, "TMPDIR=" + h.t.TempDir(), "PYTHONPATH=" + h.pythonPath}, h.env...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ctx.Err() != nil {
		h.t.Fatalf("%s %v still running after %v: stdout %q stderr %q", verifyScript, args, verifyRunBound, out.String(), errOut.String())
	}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		h.t.Fatal(err)
	}
	return code, out.String(), errOut.String()
}

// refuses runs the script and wants it to fail with exactly one line on
// stderr that says want, having started no engine.
func (h *verifyHost) refuses(want string, args ...string) {
	h.t.Helper()
	code, stdout, stderr := h.run(args...)
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	if code == 0 || len(lines) != 1 || !strings.Contains(lines[0], want) {
		h.t.Fatalf("exit %d, stderr %q; want a non-zero exit and one line saying %q (stdout %q)", code, stderr, want, stdout)
	}
	if !strings.HasPrefix(lines[0], "verify-real-stages.sh: ") {
		h.t.Errorf("stderr %q does not name the script", lines[0])
	}
	calls, err := os.ReadFile(h.calls)
	if err != nil && !os.IsNotExist(err) {
		h.t.Fatal(err)
	}
	for _, call := range strings.Split(strings.TrimSpace(string(calls)), "\n") {
		if call != "" && !strings.Contains(call, "--help") {
			h.t.Errorf("the script ran vllm %s before refusing", call)
		}
	}
}

func TestVerifyScriptHelp(t *testing.T) {
	h := newVerifyHost(t)
	code, stdout, stderr := h.run("--help")
	if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "Usage: scripts/verify-real-stages.sh") {
		t.Fatalf("--help: exit %d, stdout %q, stderr %q; want exit 0 and the usage", code, stdout, stderr)
	}
	for _, flag := range []string{"--model", "--deploy-config", "--load-timeout", "--request-timeout", "--out", "--omnipd"} {
		if !strings.Contains(stdout, flag) {
			t.Errorf("--help does not mention %s", flag)
		}
	}
	if code, _, stderr := h.run("--no-such-flag"); code != 2 || !strings.Contains(stderr, "unknown option --no-such-flag") {
		t.Errorf("an unknown flag: exit %d, stderr %q; want 2 naming it", code, stderr)
	}
}

// TestVerifyScriptNamesTheMissingPrerequisite gives a host without GPUs one
// prerequisite after another: each run stops at the first one missing, at
// once, with one line that names it.
func TestVerifyScriptNamesTheMissingPrerequisite(t *testing.T) {
	h := newVerifyHost(t)
	record := `echo "$*" >> '` + h.calls + `'`

	h.refuses("neither omnipd nor go is on PATH")

	h.stub("omnipd", `echo "omnipd stub: $*" >&2; exit 1`)
	h.refuses("curl is not on PATH")

	h.stub("curl", "exit 7")
	h.refuses("setsid (util-linux) is not on PATH")

	h.stub("setsid", "exit 1")
	h.refuses("vllm is not on PATH")

	h.stub("vllm", record+"\necho 'usage: vllm serve [model_tag] [options]'")
	if err := exec.Command(filepath.Join(h.bin, "python3"), "-c", "import vllm_omni").Run(); err == nil {
		t.Log("this machine's python3 imports vllm_omni: not checking that refusal")
	} else {
		h.refuses("cannot import vllm_omni")
	}

	h.pythonPath = t.TempDir()
	if err := os.MkdirAll(filepath.Join(h.pythonPath, "vllm_omni"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.pythonPath, "vllm_omni", "__init__.py"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h.refuses("has no serve --omni")

	h.stub("vllm", record+"\necho 'usage: vllm serve [model_tag] --omni [options]'\necho '  --omni  serve an omni pipeline'")
	h.refuses("nvidia-smi is not on PATH")

	h.stub("nvidia-smi", `echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"`)
	h.refuses("nvidia-smi lists 1 GPU(s); --devices 0-2 needs 3")

	h.stub("nvidia-smi", `for i in 0 1 2 3; do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done`)
	h.env = []string{"HF_HUB_OFFLINE=1"}
	h.refuses("checkpoint Qwen/Qwen3-Omni-30B-A3B-Instruct is not in the Hugging Face cache (" + h.home + "/.cache/huggingface/hub)")
	h.refuses("checkpoint directory /nonexistent/qwen3-omni not found", "--model", "/nonexistent/qwen3-omni")

	ckpt := t.TempDir()
	if err := os.WriteFile(filepath.Join(ckpt, "config.json"), []byte(`{"model_type":"qwen3_omni_moe"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	port := strconv.Itoa(busy.Addr().(*net.TCPAddr).Port)
	h.refuses("port "+port+" (--vllm-port) is in use", "--model", ckpt, "--vllm-port", port)

	// Every prerequisite met, the plan refused: that ends the run before
	// vllm-omni's own pipeline is started, not an hour later.
	h.stub("omnipd", `echo "stage 2 is a talker (pipeline qwen3_omni_moe); no stage workers here" >&2; exit 1`)
	fixture, err := filepath.Abs(filepath.Join(repoRoot, "deploy/testdata/fixtures/vllm-omni/qwen3_omni_moe.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	h.refuses("omnipd plan --target vllm --pd cannot plan "+fixture+": stage 2 is a talker",
		"--model", ckpt, "--out", t.TempDir(), "--vllm-port", verifyFreePort(t), "--omnipd-port", verifyFreePort(t), "--base-port", verifyFreePort(t))
}

// verifyFreePort is a port nothing listens on now.
func verifyFreePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// verifyFakeEngine answers as both pipelines would, for the script's whole
// run without GPUs: /health, and chat completions whole or streamed (text,
// then 24 kHz WAV audio). FAKE_SHIFT adds that much to every sample; the
// server writes its pid to FAKE_PIDS, so that a test sees it stopped.
const verifyFakeEngine = `
import base64, io, json, os, struct, sys, wave
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port, shift = int(sys.argv[1]), int(os.environ.get("FAKE_SHIFT", "0"))
with open(os.environ["FAKE_PIDS"], "a") as f:
    f.write("%d\n" % os.getpid())
def wav(n):
    b = io.BytesIO()
    with wave.open(b, "wb") as w:
        w.setnchannels(1); w.setsampwidth(2); w.setframerate(24000)
        w.writeframes(b"".join(struct.pack("<h", 100 * (i % 50) + shift) for i in range(n)))
    return base64.b64encode(b.getvalue()).decode()
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        audio, text = "audio" in body["modalities"], "Hello from the fake engine."
        if body.get("stream"):
            self.send_response(200); self.send_header("Content-Type", "text/event-stream"); self.end_headers()
            events = [{"modality": "text", "choices": [{"index": 0, "delta": {"content": text}}]}]
            events += [{"modality": "audio", "choices": [{"index": 0, "delta": {"content": wav(1920)}}]}] * (2 if audio else 0)
            self.wfile.write(b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n")
            return
        choices = [{"index": 0, "message": {"role": "assistant", "content": text}}]
        if audio:
            choices.append({"index": 0, "message": {"role": "assistant", "content": None, "audio": {"data": wav(3840)}}})
        out = json.dumps({"choices": choices}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(out))); self.end_headers(); self.wfile.write(out)
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
`

// TestVerifyScriptComparesTheTwoPipelines runs the script to its end on fake
// engines: vllm serve --omni, and omnipd's plan and serve. Equal answers
// are reported equal (exit 0); a PD pipeline whose audio differs where
// vllm-omni repeats itself is reported different (exit 1). Either way every
// server it started is stopped.
func TestVerifyScriptComparesTheTwoPipelines(t *testing.T) {
	h := newVerifyHost(t)
	for _, tool := range []string{"sh", "tail", "curl", "setsid"} {
		path, err := exec.LookPath(tool)
		if err != nil {
			t.Skipf("%s is not on this machine's PATH: %v", tool, err)
		}
		h.link(tool, path)
	}
	engine := filepath.Join(t.TempDir(), "engine.py")
	if err := os.WriteFile(engine, []byte(verifyFakeEngine), 0o644); err != nil {
		t.Fatal(err)
	}
	pids := filepath.Join(t.TempDir(), "pids")
	port := `"$(echo "$*" | sed -n 's/.*--port \([0-9]*\).*/\1/p')"`
	h.stub("vllm", `case "$*" in *--help*) echo '  --omni'; exit 0;; esac
exec python3 '`+engine+`' `+port)
	// The plan starts one fake instance and says what launch.sh says once ready.
	h.stub("omnipd", `case $1 in
plan) echo 'echo x > omnipd-secret; echo "stages: []" > omnipd-vllm.yaml'
      echo "python3 '`+engine+`' $(echo "$*" | sed -n 's/.*--base-port \([0-9]*\).*/\1/p') &"
      echo 'echo "launch.sh: every instance is ready."; wait' ;;
serve) FAKE_SHIFT=${FAKE_PD_SHIFT:-0} exec python3 '`+engine+`' `+port+` ;;
esac`)
	h.stub("nvidia-smi", `for i in 0 1 2; do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done`)
	h.pythonPath = t.TempDir()
	if err := os.MkdirAll(filepath.Join(h.pythonPath, "vllm_omni"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.pythonPath, "vllm_omni", "__init__.py"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ckpt := t.TempDir()
	if err := os.WriteFile(filepath.Join(ckpt, "config.json"), []byte(`{}`), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name, shift string
		code        int
		verdict     string
	}{
		{"equal", "0", 0, "EQUAL"},
		{"different", "3", 1, "DIFFERENT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			// The fakes start at once: look again often, not every 5 s.
			h.env = []string{"FAKE_PIDS=" + pids, "FAKE_PD_SHIFT=" + tc.shift, "OMNIPD_VERIFY_POLL_SECONDS=0.2"}
			code, stdout, stderr := h.run("--model", ckpt, "--out", out, "--stop-timeout", "10",
				"--vllm-port", verifyFreePort(t), "--omnipd-port", verifyFreePort(t), "--base-port", verifyFreePort(t))
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stdout %q stderr %q", code, tc.code, stdout, stderr)
			}
			report, err := os.ReadFile(filepath.Join(out, "report.txt"))
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(strings.TrimSpace(string(report)), "\n") {
				fields := strings.Fields(line)
				want := tc.verdict
				if fields[0] == "text-only" {
					want = "EQUAL" // no audio to differ
				}
				if len(fields) < 2 || fields[1] != want {
					t.Errorf("report line %q; want %s", line, want)
				}
			}
			if !strings.Contains(stdout, string(report)) {
				t.Errorf("stdout %q does not carry the report %q", stdout, report)
			}
		})
	}

	// Every fake server, of both pipelines and both runs, is gone.
	raw, err := os.ReadFile(pids)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(strings.Fields(string(raw))); n != 6 {
		t.Errorf("%d fake servers started, want 6 (A, the instance and serve, twice)", n)
	}
	for _, f := range strings.Fields(string(raw)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		if p, err := os.FindProcess(pid); err == nil && p.Signal(syscall.Signal(0)) == nil {
			t.Errorf("fake server %d still runs after the script ended", pid)
			_ = p.Kill()
		}
	}
}
