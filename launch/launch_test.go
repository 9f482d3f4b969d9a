package launch

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var omnipdBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "omnipd-launch")
	if err != nil {
		panic(err)
	}
	omnipdBin = filepath.Join(dir, "omnipd")
	if out, err := exec.Command("go", "build", "-o", omnipdBin, "../cmd/omnipd").CombinedOutput(); err != nil {
		panic(string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func healthy(url string) bool {
	resp, err := (&http.Client{Timeout: time.Second}).Get(url + "/health")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

// A worker killed with SIGKILL under load is started again on the same
// address; requests to it fail while it is down and succeed after.
func TestSupervisorRestartsAKilledWorker(t *testing.T) {
	MinBackoff = 50 * time.Millisecond
	var mu sync.Mutex
	var lines []string
	s := superviseHealthy(t, Spec{Name: "thinker-0"}, func(l string) { mu.Lock(); lines = append(lines, l); mu.Unlock() })
	defer s.Stop(5 * time.Second)
	url := s.URL()

	// Load while the worker dies.
	var wg sync.WaitGroup
	stopLoad := make(chan struct{})
	var ok, failed int
	var lmu sync.Mutex
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stopLoad:
					return
				default:
				}
				resp, err := (&http.Client{Timeout: 5 * time.Second}).Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hello","max_tokens":4}`))
				lmu.Lock()
				if err == nil && resp.StatusCode == 200 {
					ok++
				} else {
					failed++
				}
				lmu.Unlock()
				if resp != nil {
					resp.Body.Close()
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	time.Sleep(100 * time.Millisecond)
	s.mu.Lock()
	pid := s.current.cmd.Process.Pid
	s.mu.Unlock()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for (s.Restarts() == 0 || !healthy(url)) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	close(stopLoad)
	wg.Wait()
	if s.Restarts() != 1 || !healthy(url) {
		t.Fatalf("restarts %d, healthy %v; progress: %v", s.Restarts(), healthy(url), lines)
	}
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"after","max_tokens":4}`))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("after the restart: %v %v", resp, err)
	}
	resp.Body.Close()
	if ok == 0 {
		t.Error("no request succeeded under load")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lines) < 2 || !strings.Contains(lines[0], "exited") || !strings.Contains(lines[1], "restarted") {
		t.Errorf("progress lines %v", lines)
	}
}

// Stop leaves no process behind, and a stopped worker is not restarted.
func TestStopLeavesNoProcess(t *testing.T) {
	s := superviseHealthy(t, Spec{Name: "w"}, nil)
	pid := currentPID(s)
	if err := s.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("worker %d still runs after Stop", pid)
	}
	time.Sleep(200 * time.Millisecond)
	if healthy(s.URL()) || s.Restarts() != 0 {
		t.Errorf("a stopped worker came back (restarts %d)", s.Restarts())
	}
}

// A worker given a share of the host runs with that GOMAXPROCS.
func TestWorkerGetsItsShareOfTheHost(t *testing.T) {
	s := superviseHealthy(t, Spec{Name: "w", Procs: 3}, nil)
	defer s.Stop(5 * time.Second)
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", currentPID(s)))
	if err != nil {
		t.Skipf("cannot read the worker's environment here: %v", err)
	}
	var got []string
	for kv := range strings.SplitSeq(string(env), "\x00") {
		if strings.HasPrefix(kv, "GOMAXPROCS=") {
			got = append(got, kv)
		}
	}
	if len(got) == 0 || got[len(got)-1] != "GOMAXPROCS=3" {
		t.Errorf("worker environment has %v, want GOMAXPROCS=3 last", got)
	}
}

// superviseHealthy starts a supervised worker for spec and waits until it
// answers /health. The caller stops it.
func superviseHealthy(t *testing.T, spec Spec, progress func(string)) *Supervisor {
	t.Helper()
	return superviseHealthyLog(t, spec, os.Stderr, progress)
}

// superviseHealthyLog is superviseHealthy with the worker's output to log.
func superviseHealthyLog(t *testing.T, spec Spec, log io.Writer, progress func(string)) *Supervisor {
	t.Helper()
	s, err := Supervise(omnipdBin, spec, log, progress)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.WaitHealthy(ctx); err != nil {
		s.Stop(5 * time.Second)
		t.Fatal(err)
	}
	return s
}

// currentPID is the process id of the worker s runs now.
func currentPID(s *Supervisor) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current.cmd.Process.Pid
}
