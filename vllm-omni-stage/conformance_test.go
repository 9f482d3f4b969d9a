package vllmomnistage_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/stageapi/stagetest"
)

// The stage ids of the Qwen3-Omni fixture the stand-in serves.
const (
	thinkerStage  = 0
	talkerStage   = 1
	code2wavStage = 2
)

const (
	secret = "stagetest-vllm-omni-secret"
	// model is the stand-in's model argument, which the worker serves
	// under its own name (no --served-model-name).
	model = "standin-model"
	// layer is the stand-in Talker's accept_hidden_layer: the one hidden
	// layer its Thinker captures.
	layer = 24
	// fixture is the deploy config the stages come from, relative to the
	// checkout's root.
	fixture = "deploy/testdata/fixtures/vllm-omni/qwen3_omni_moe.yaml"
)

// omnipd's vllm-omni stage worker, on its stand-in engine, passes the stage
// API's conformance suite: every stage a subprocess started as a plan
// starts it, the prefill/decode pair with the NIXL connector the stand-in
// speaks.
func TestConformance(t *testing.T) {
	py := python(t)
	nixl, err := kvconnector.NewRegistry().Lookup(kvconnector.NixlConnector, nil)
	if err != nil {
		t.Fatal(err)
	}
	kv := func(role string) string {
		return fmt.Sprintf(`{"kv_connector":%q,"kv_role":%q}`, kvconnector.NixlConnector, role)
	}
	stagetest.Run(t, stagetest.Deployment{
		Secret: secret, Model: model, Layer: layer,
		Thinker: func(t *testing.T) string { return startStage(t, py, thinkerStage, "") },
		PD: func(t *testing.T) stagetest.Pair {
			return stagetest.Pair{
				Prefill: startStage(t, py, thinkerStage, kv("kv_producer")),
				Decode:  startStage(t, py, thinkerStage, kv("kv_consumer")),
				KV:      nixl,
			}
		},
		Talker:   func(t *testing.T) string { return startStage(t, py, talkerStage, "") },
		Code2Wav: func(t *testing.T) string { return startStage(t, py, code2wavStage, "") },
	})
}

// python is the interpreter the worker runs on: OMNIPD_PYTHON (what
// scripts/test.sh found or installed, scripts/python3.sh), else
// /usr/bin/python3, else python3 on PATH. Without one the test fails: the
// worker is not checked at all otherwise.
func python(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("OMNIPD_PYTHON"); p != "" {
		return p
	}
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	if p, err := exec.LookPath("python3"); err == nil {
		return p
	}
	t.Fatal("no python3 (neither /usr/bin/python3 nor python3 on PATH): the vllm-omni stage worker is Python; " +
		"install it (apt-get install python3, or ./scripts/python3.sh) and run the test again")
	return ""
}

// syncBuffer is a worker's stderr, written by the process and read by the
// test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startStage starts one stage instance, waits until its /health is 200,
// and stops it (SIGTERM) when t ends, showing its stderr if t failed.
func startStage(t *testing.T, py string, stageID int, kvConfig string) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	// A free port can be taken again before the worker binds it: that
	// one case is tried again, a few times.
	const attempts = 3
	for attempt := 1; ; attempt++ {
		url, stderr, err := tryStage(t, py, root, stageID, kvConfig)
		if err == nil {
			return url
		}
		if attempt == attempts || !strings.Contains(stderr, "cannot listen") {
			t.Fatalf("%s: %v\nits output:\n%s", describe(stageID, kvConfig), err, stderr)
		}
	}
}

// describe names a stage instance in a failure.
func describe(stageID int, kvConfig string) string {
	if kvConfig == "" {
		return fmt.Sprintf("stage %d", stageID)
	}
	return fmt.Sprintf("stage %d with --kv-transfer-config %s", stageID, kvConfig)
}

// tryStage is one attempt of startStage: the instance's URL, or why it
// did not come up and what it wrote.
func tryStage(t *testing.T, py, root string, stageID int, kvConfig string) (url, stderr string, err error) {
	port, err := freePort()
	if err != nil {
		return "", "", err
	}
	args := []string{"-m", "omnipd_stage", model, "--deploy-config", filepath.Join(root, fixture),
		"--stage-id", strconv.Itoa(stageID), "--host", "127.0.0.1", "--port", strconv.Itoa(port)}
	if kvConfig != "" {
		args = append(args, "--kv-transfer-config", kvConfig)
	}
	cmd := exec.Command(py, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(),
		"PYTHONPATH="+filepath.Join(root, "vllm-omni-stage", "standin")+string(filepath.ListSeparator)+filepath.Join(root, "vllm-omni-stage"),
		// No __pycache__ left in the checkout.
		"VLLM_API_KEY="+secret, "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1")
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", "", fmt.Errorf("start %s: %w", py, err)
	}
	// exited is closed once the process is gone, waitErr then its exit.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	stop := func() error {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			return waitErr
		case <-time.After(30 * time.Second): // only a hung worker waits this long
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("did not stop on SIGTERM: %w", waitErr)
		}
	}
	url = "http://127.0.0.1:" + strconv.Itoa(port)
	if err := waitHealthy(t.Context(), url, exited); err != nil {
		stopErr := stop()
		return "", out.String(), errors.Join(err, stopErr)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil && !isSIGTERM(err) {
			t.Errorf("%s at %s: %v", describe(stageID, kvConfig), url, err)
		}
		if t.Failed() {
			t.Logf("%s at %s, its output:\n%s", describe(stageID, kvConfig), url, out.String())
		}
	})
	return url, "", nil
}

// isSIGTERM says whether err is the exit of a process that SIGTERM ended,
// or that exited 0 on it.
func isSIGTERM(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM
}

// waitHealthy polls /health until it is 200, the process exits, or ctx
// (the test's deadline) ends.
func waitHealthy(ctx context.Context, url string, exited <-chan struct{}) error {
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("exited before it was ready")
		case <-ctx.Done():
			return fmt.Errorf("not ready (GET /health 200) by the test's deadline: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
