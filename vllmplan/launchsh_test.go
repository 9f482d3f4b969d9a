package vllmplan

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/omnipd/omnipd/deploy"
)

// TestMain runs the test binary as the fake vllm when a launch.sh under
// test starts it so (OMNIPD_FAKE_VLLM), and the tests otherwise.
func TestMain(m *testing.M) {
	if mode := os.Getenv("OMNIPD_FAKE_VLLM"); mode != "" {
		os.Exit(fakeVLLM(mode, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// fakeVLLM stands in for `vllm serve MODEL --host H --port P ...` when the
// test binary runs as "vllm": mode "fail" dies at start-up the way an engine
// that cannot get its GPU does; "serve" answers /health on its port until
// SIGTERM, after writing its pid to fake-vllm-P.pid for the test to kill it.
func fakeVLLM(mode string, args []string) int {
	host, port := "127.0.0.1", ""
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--host":
			host = args[i+1]
		case "--port":
			port = args[i+1]
		}
	}
	if mode == "fail" || port == "" {
		fmt.Fprintln(os.Stderr, "fake vllm: CUDA error: out of memory")
		return 3
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake vllm:", err)
		return 1
	}
	if err := os.WriteFile("fake-vllm-"+port+".pid", []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return 1
	}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	return 0
}

// freePortPair finds a port p with p+1 free too, for a plan of two
// instances.
func freePortPair(t *testing.T) int {
	t.Helper()
	for range 50 {
		a, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := a.Addr().(*net.TCPAddr).Port
		b, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1))
		a.Close()
		if err == nil {
			b.Close()
			return p
		}
	}
	t.Fatal("no two adjacent free ports")
	return 0
}

type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// launchScript writes the plan's launch.sh for a prefill and a decode
// instance at basePort and basePort+1 into a fresh directory.
func launchScript(t *testing.T, basePort int) string {
	t.Helper()
	doc, _, err := deploy.LoadFile("../deploy/testdata/fixtures/vllm-omni/qwen3_omni_moe_thinking.yaml",
		deploy.Options{PD: true, Connector: "NixlConnector", Devices: "0-3"})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := PlanVLLM(doc, VLLMOptions{BasePort: basePort})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "launch.sh"), []byte(plan.Shell()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// runLaunch starts `sh launch.sh` in dir with vllm on PATH (the fake, in
// mode) or, when mode is "", without.
func runLaunch(t *testing.T, dir, mode string) (*exec.Cmd, *syncBuf, chan struct{}) {
	t.Helper()
	path := "/usr/bin:/bin"
	env := []string{"HOME=" + dir}
	if mode != "" {
		bin := filepath.Join(dir, "bin")
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(self, filepath.Join(bin, "vllm")); err != nil {
			t.Fatal(err)
		}
		path = bin + ":" + path
		env = append(env, "OMNIPD_FAKE_VLLM="+mode)
	}
	cmd := exec.Command("sh", "launch.sh")
	cmd.Dir = dir
	cmd.Env = append(env, "PATH="+path)
	out := &syncBuf{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	return cmd, out, done
}

func exitedWithin(t *testing.T, done chan struct{}, d time.Duration, out *syncBuf) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("launch.sh still running after %v:\n%s", d, out.String())
	}
}

func TestLaunchScriptWithoutVLLMFailsAtOnce(t *testing.T) {
	for _, d := range []string{"/usr/bin", "/bin"} {
		if _, err := os.Stat(filepath.Join(d, "vllm")); err == nil {
			t.Skipf("%s/vllm exists here", d)
		}
	}
	cmd, out, done := runLaunch(t, launchScript(t, freePortPair(t)), "")
	exitedWithin(t, done, 20*time.Second, out)
	if code := cmd.ProcessState.ExitCode(); code != 127 || !strings.Contains(out.String(), "vllm is not on PATH") {
		t.Errorf("exit %d, want 127 and a clear message:\n%s", code, out.String())
	}
}

func TestLaunchScriptFailsWhenAnInstanceDiesAtStart(t *testing.T) {
	cmd, out, done := runLaunch(t, launchScript(t, freePortPair(t)), "fail")
	exitedWithin(t, done, 30*time.Second, out)
	o := out.String()
	if code := cmd.ProcessState.ExitCode(); code == 0 || !strings.Contains(o, "thinker-prefill-0 exited before it was ready") || !strings.Contains(o, "CUDA error: out of memory") {
		t.Errorf("exit %d; want non-zero naming the instance and showing its log:\n%s", code, o)
	}
}

// With every instance up, launch.sh says what to run next and stays; when
// one instance dies it stops the other and fails.
func TestLaunchScriptWaitsForHealthThenWatches(t *testing.T) {
	base := freePortPair(t)
	dir := launchScript(t, base)
	cmd, out, done := runLaunch(t, dir, "serve")
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(out.String(), "every instance is ready"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("launch.sh did not report the instances ready:\n%s", out.String())
		}
		select {
		case <-done:
			t.Fatalf("launch.sh exited %v:\n%s", cmd.ProcessState, out.String())
		default:
		}
	}
	if !strings.Contains(out.String(), "omnipd serve --config omnipd-vllm.yaml --secret-file omnipd-secret") {
		t.Errorf("no serve command to run next:\n%s", out.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "omnipd-vllm.yaml")); err != nil {
		t.Errorf("config not written: %v", err)
	}
	pid, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("fake-vllm-%d.pid", base+1)))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(string(pid))
	if err := syscall.Kill(n, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	exitedWithin(t, done, 30*time.Second, out)
	if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(out.String(), "thinker-decode-0 exited") {
		t.Errorf("exit %d after the decode died; want 1 naming it:\n%s", code, out.String())
	}
	prefill := fmt.Sprintf("http://127.0.0.1:%d/health", base)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(prefill)
		if err != nil {
			break
		}
		resp.Body.Close()
		if time.Now().After(deadline) {
			t.Fatal("the prefill instance outlived launch.sh")
		}
	}
}
