package launch

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// syncBuffer collects a worker's output, which arrives from exec's copying
// goroutine.
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

// waitUntil waits for cond, bounded by the test's deadline.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline, ok := t.Deadline()
	if !ok {
		deadline = time.Now().Add(5 * time.Minute)
	}
	deadline = deadline.Add(-5 * time.Second) // room to report
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// bindLoopback binds a free loopback port, as omnipd serve settles a
// worker's before starting it.
func bindLoopback(t *testing.T) *net.TCPListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln.(*net.TCPListener)
}

// producerSpec is a prefill worker's spec on listeners bound here.
func producerSpec(t *testing.T, name string) Spec {
	t.Helper()
	ln, kv := bindLoopback(t), bindLoopback(t)
	return Spec{Name: name, Listener: ln, KVListener: kv,
		KVTransferConfig: fmt.Sprintf(`{"kv_connector":"ReferenceConnector","kv_role":"kv_producer","engine_id":"%s","kv_port":%d}`, name, kv.Addr().(*net.TCPAddr).Port)}
}

// bindable reports whether this process can bind addr now.
func bindable(addr string) bool {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// A worker started on listeners bound beforehand serves on those very
// sockets — its HTTP API and its KV side channel — so that no other process
// can take either port meanwhile; and once it is gone, both ports refuse
// connections: nothing of this process kept them listening.
func TestWorkerServesOnTheListenersItIsGiven(t *testing.T) {
	spec := producerSpec(t, "thinker-prefill-0")
	addr, kvAddr := spec.Listener.Addr().String(), spec.KVListener.Addr().String()
	var log syncBuffer
	w, err := Start(omnipdBin, spec, &log)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop(5 * time.Second)
	if w.URL != "http://"+addr {
		t.Errorf("URL %s, want http://%s", w.URL, addr)
	}
	waitUntil(t, "the worker to be healthy", func() bool { return healthy(w.URL) })
	waitUntil(t, "the worker to log its KV side channel", func() bool { return strings.Contains(log.String(), "kv_side_channel=") })
	if !strings.Contains(log.String(), "kv_side_channel="+kvAddr) {
		t.Errorf("the worker's KV side channel is not on %s:\n%s", kvAddr, log.String())
	}
	for _, a := range []string{addr, kvAddr} {
		if bindable(a) {
			t.Errorf("%s could be bound while the worker serves on it", a)
		}
	}
	if err := syscall.Kill(w.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-w.done
	for _, a := range []string{addr, kvAddr} {
		if c, err := net.Dial("tcp", a); err == nil {
			c.Close()
			t.Errorf("%s accepts connections after its worker died", a)
		}
	}
}

// A restarted worker gets its ports back, bound again just before it
// starts. A port another process took while the worker was down is said so
// and tried again at the next backoff, until it is free.
func TestRestartedWorkerGetsItsPortsBack(t *testing.T) {
	saved := MinBackoff
	MinBackoff = 10 * time.Millisecond
	t.Cleanup(func() { MinBackoff = saved })
	for _, taken := range []string{"", "port", "KV side channel's port"} {
		name := "nothing taken"
		if taken != "" {
			name = "its " + taken + " taken"
		}
		t.Run(name, func(t *testing.T) {
			spec := producerSpec(t, "thinker-prefill-0")
			addrs := map[string]string{"port": spec.Listener.Addr().String(), "KV side channel's port": spec.KVListener.Addr().String()}
			var mu sync.Mutex
			var lines []string
			var squatter net.Listener
			// progress runs on the supervisor's goroutine, before it acts on
			// what the line says: the port is taken while the worker is down
			// and freed once the supervisor has found it taken.
			progress := func(l string) {
				mu.Lock()
				defer mu.Unlock()
				lines = append(lines, l)
				switch {
				case taken != "" && strings.Contains(l, "exited"):
					ln, err := net.Listen("tcp", addrs[taken])
					if err != nil {
						t.Errorf("the dead worker's %s: %v", taken, err)
						return
					}
					squatter = ln
				case squatter != nil && strings.Contains(l, "is taken"):
					squatter.Close()
					squatter = nil
				}
			}
			var log syncBuffer
			s := superviseHealthyLog(t, spec, &log, progress)
			defer s.Stop(5 * time.Second)
			url := s.URL()
			if err := syscall.Kill(currentPID(s), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "the restarted worker", func() bool { return s.Restarts() == 1 && healthy(url) })
			if s.URL() != url {
				t.Errorf("URL %s after the restart, was %s", s.URL(), url)
			}
			waitUntil(t, "the restarted worker to log its KV side channel", func() bool {
				return strings.Count(log.String(), "kv_side_channel=") == 2
			})
			if n := strings.Count(log.String(), "kv_side_channel="+addrs["KV side channel's port"]); n != 2 {
				t.Errorf("%d of 2 workers had their KV side channel on %s:\n%s", n, addrs["KV side channel's port"], log.String())
			}
			mu.Lock()
			defer mu.Unlock()
			var found bool
			for _, l := range lines {
				found = found || strings.Contains(l, fmt.Sprintf("not restarted: its %s %s is taken; trying again in", taken, addrs[taken]))
			}
			if taken != "" && !found {
				t.Errorf("no progress line says its %s was taken: %q", taken, lines)
			}
			if last := lines[len(lines)-1]; !strings.Contains(last, "restarted") {
				t.Errorf("progress lines %q", lines)
			}
		})
	}
}
