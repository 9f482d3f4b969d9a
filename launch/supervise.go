package launch

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Supervisor keeps one worker running: when it exits without being asked
// to, it is started again on the same port after a backoff that doubles up
// to MaxBackoff and resets once a worker has stayed up for StableAfter.
type Supervisor struct {
	exe      string
	spec     Spec
	log      io.Writer
	progress func(string)

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
// receives a line for each start, exit and restart.
func Supervise(exe string, spec Spec, log io.Writer, progress func(string)) (*Supervisor, error) {
	if spec.Port == 0 {
		host := spec.Host
		if host == "" {
			host = "127.0.0.1"
		}
		p, err := freePort(host)
		if err != nil {
			return nil, err
		}
		spec.Port = p // keep the address across restarts
	}
	if progress == nil {
		progress = func(string) {}
	}
	w, err := Start(exe, spec, log)
	if err != nil {
		return nil, err
	}
	s := &Supervisor{exe: exe, spec: spec, log: log, progress: progress, current: w, stop: make(chan struct{}), done: make(chan struct{})}
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
		select {
		case <-time.After(backoff):
		case <-s.stop:
			return
		}
		backoff = min(2*backoff, MaxBackoff)
		nw, err := Start(s.exe, s.spec, s.log)
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
