package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Supervisor keeps one worker running: when it exits without being asked
// to, it is started again on the same ports after a backoff that doubles up
// to MaxBackoff and resets once a worker has stayed up for StableAfter.
//
// Each restart binds the ports again just before the new worker starts and
// hands them over as Start does. A port another process took while the
// worker was down is said so in a progress line and tried again at the next
// backoff: a worker started without it would only fail.
type Supervisor struct {
	exe string
	// spec has no listeners; each start binds addr and kvAddr anew.
	spec         Spec
	addr, kvAddr string // kvAddr is empty when the worker binds its own
	log          io.Writer
	progress     func(string)

	mu      sync.Mutex
	current *Worker
	stopped bool

	restarts atomic.Int64
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

// Backoff bounds. Variables so tests can shorten them.
var (
	MinBackoff  = 100 * time.Millisecond
	MaxBackoff  = 5 * time.Second
	StableAfter = 30 * time.Second
)

// Supervise starts spec's worker and keeps it running until Stop. progress
// receives a line for each start, exit and restart. spec's listeners are
// owned from the call on, as Start owns them; without a Listener, Host:Port
// is bound here, and that port is the worker's across restarts.
func Supervise(exe string, spec Spec, log io.Writer, progress func(string)) (*Supervisor, error) {
	if spec.Listener == nil {
		ln, err := listen(spec.Host, spec.Port)
		if err != nil {
			closeListeners(spec)
			return nil, fmt.Errorf("start worker %s: %w", spec.Name, err)
		}
		spec.Listener = ln
	}
	if progress == nil {
		progress = func(string) {}
	}
	s := &Supervisor{exe: exe, spec: spec, addr: spec.Listener.Addr().String(), log: log, progress: progress, stop: make(chan struct{}), done: make(chan struct{})}
	if spec.KVListener != nil {
		s.kvAddr = spec.KVListener.Addr().String()
	}
	s.spec.Listener, s.spec.KVListener = nil, nil
	w, err := Start(exe, spec, log)
	if err != nil {
		return nil, err
	}
	s.current = w
	go s.watch()
	return s, nil
}

// URL is the worker's base URL; it stays the same across restarts.
func (s *Supervisor) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current.URL
}

// Restarts counts how many times the worker was started again.
func (s *Supervisor) Restarts() int { return int(s.restarts.Load()) }

// WaitHealthy waits until the current worker answers /health.
func (s *Supervisor) WaitHealthy(ctx context.Context) error {
	s.mu.Lock()
	w := s.current
	s.mu.Unlock()
	return w.WaitHealthy(ctx)
}

func (s *Supervisor) watch() {
	defer close(s.done)
	backoff := MinBackoff
	for {
		s.mu.Lock()
		w := s.current
		s.mu.Unlock()
		started := time.Now()
		<-w.done
		s.mu.Lock()
		stopped := s.stopped
		s.mu.Unlock()
		if stopped {
			return
		}
		_, err := w.Exited()
		if time.Since(started) > StableAfter {
			backoff = MinBackoff
		}
		s.progress(fmt.Sprintf("worker %s exited (%v); restarting in %v", s.spec.Name, err, backoff))
		var spec Spec
		for {
			select {
			case <-time.After(backoff):
			case <-s.stop:
				return
			}
			backoff = min(2*backoff, MaxBackoff)
			if spec, err = s.bind(); err == nil {
				break
			}
			s.progress(fmt.Sprintf("worker %s not restarted: %v; trying again in %v", s.spec.Name, err, backoff))
		}
		nw, err := Start(s.exe, spec, s.log)
		s.mu.Lock()
		if err != nil || s.stopped {
			s.mu.Unlock()
			if nw != nil {
				_ = nw.Stop(time.Second)
			}
			if err != nil {
				s.progress(fmt.Sprintf("worker %s could not be restarted: %v", s.spec.Name, err))
			}
			return
		}
		s.current = nw
		s.mu.Unlock()
		s.restarts.Add(1)
		s.progress(fmt.Sprintf("worker %s restarted", s.spec.Name))
	}
}

// bind binds the worker's ports again, for a restart: its spec with them.
func (s *Supervisor) bind() (Spec, error) {
	spec := s.spec
	var err error
	if spec.Listener, err = rebind(s.addr, "port"); err != nil {
		return Spec{}, err
	}
	if s.kvAddr != "" {
		if spec.KVListener, err = rebind(s.kvAddr, "KV side channel's port"); err != nil {
			spec.Listener.Close()
			return Spec{}, err
		}
	}
	return spec, nil
}

// rebind binds addr, where the worker's port what was, for its next start;
// the error says when another process holds it.
func rebind(addr, what string) (*net.TCPListener, error) {
	ln, err := net.Listen("tcp", addr)
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return nil, fmt.Errorf("its %s %s is taken", what, addr)
	case err != nil:
		return nil, fmt.Errorf("cannot bind its %s %s: %w", what, addr, err)
	}
	return ln.(*net.TCPListener), nil
}

// Stop stops the worker for good (SIGTERM, then SIGKILL after grace) and
// waits for the supervision to end.
func (s *Supervisor) Stop(grace time.Duration) error {
	s.mu.Lock()
	s.stopped = true
	w := s.current
	s.mu.Unlock()
	s.stopOnce.Do(func() { close(s.stop) })
	err := w.Stop(grace)
	<-s.done
	return err
}
