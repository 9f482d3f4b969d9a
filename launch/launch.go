// Package launch starts omnipd's reference workers as child processes on
// loopback and stops them again: no child outlives omnipd, whether it exits
// cleanly, fails to start, or is killed (the kernel signals the children of
// a dead parent on Linux). The plans that start vllm serve instances and
// vllm-omni stage workers instead are package vllmplan's.
package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Spec says how to start one reference worker.
//
// Its ports are bound in this process and handed to the worker as inherited
// sockets (omnipd worker --listen-fd, --kv-listen-fd), never closed here for
// the worker to bind again: between such a close and the worker's bind,
// any process that asks the kernel for a free port can be given that one.
type Spec struct {
	// Name identifies the worker in progress lines and logs ("thinker-prefill-0").
	Name string
	// Listener is the worker's HTTP port, already bound: a caller that
	// settles its ports before it starts workers holds each until here.
	// When nil, Host:Port is bound (Host default 127.0.0.1; Port 0 picks a
	// free one). Start and Supervise own it from the call on.
	Listener *net.TCPListener
	Host     string
	Port     int
	// KVListener, when set, is the KV side channel of a Thinker that
	// exports KV (kv_producer, kv_both), already bound, on the port its
	// KVTransferConfig names, and owned from the call on as Listener is.
	// When nil, the worker binds kv_ip:kv_port itself.
	KVListener *net.TCPListener
	// KVTransferConfig is the worker's --kv-transfer-config JSON, or empty.
	KVTransferConfig string
	// Secret is the deployment secret, passed in the environment (never on
	// the command line, where other users could read it).
	Secret string
	// Args are further worker flags.
	Args []string
	// Procs, when positive, is the worker's GOMAXPROCS: its share of the
	// host's CPUs when several processes serve from one host. Go sizes
	// every process to the whole host by default, and processes that each
	// schedule for every CPU contend for them. Zero leaves the default.
	Procs int
}

// Worker is a running child worker.
type Worker struct {
	Name string
	// URL is the worker's base URL, http://host:port.
	URL string

	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	err  error
}

// Start runs `exe worker` for spec. Its output goes to log. The worker
// inherits its listeners; Start closes this process's copies whether or not
// the worker started, so that once the worker is gone its ports refuse
// connections instead of queueing them where nobody will answer.
func Start(exe string, spec Spec, log io.Writer) (*Worker, error) {
	defer func() { closeListeners(spec) }() // spec.Listener may be bound below
	if spec.Listener == nil {
		ln, err := listen(spec.Host, spec.Port)
		if err != nil {
			return nil, fmt.Errorf("start worker %s: %w", spec.Name, err)
		}
		spec.Listener = ln
	}
	args := []string{"worker"}
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, l := range []struct {
		flag string
		ln   *net.TCPListener
	}{{"--listen-fd", spec.Listener}, {"--kv-listen-fd", spec.KVListener}} {
		if l.ln == nil {
			continue
		}
		f, err := l.ln.File()
		if err != nil {
			return nil, fmt.Errorf("start worker %s: pass its listener on %s: %w", spec.Name, l.ln.Addr(), err)
		}
		// ExtraFiles[i] is the child's descriptor 3+i.
		args = append(args, l.flag, strconv.Itoa(3+len(files)))
		files = append(files, f)
	}
	if spec.KVTransferConfig != "" {
		args = append(args, "--kv-transfer-config", spec.KVTransferConfig)
	}
	args = append(args, spec.Args...)
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "OMNIPD_SECRET="+spec.Secret)
	if spec.Procs > 0 {
		cmd.Env = append(cmd.Env, "GOMAXPROCS="+strconv.Itoa(spec.Procs))
	}
	cmd.ExtraFiles = files
	cmd.SysProcAttr = childAttrs()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker %s: %w", spec.Name, err)
	}
	w := &Worker{Name: spec.Name, URL: "http://" + spec.Listener.Addr().String(), cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
		close(w.done)
	}()
	return w, nil
}

// listen binds host:port (host default 127.0.0.1; port 0 picks a free one)
// for a worker.
func listen(host string, port int) (*net.TCPListener, error) {
	if host == "" {
		host = "127.0.0.1"
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return nil, err
	}
	return ln.(*net.TCPListener), nil
}

func closeListeners(spec Spec) {
	if spec.Listener != nil {
		spec.Listener.Close()
	}
	if spec.KVListener != nil {
		spec.KVListener.Close()
	}
}

// Exited reports whether the process has ended, and how.
func (w *Worker) Exited() (bool, error) {
	select {
	case <-w.done:
		w.mu.Lock()
		defer w.mu.Unlock()
		return true, w.err
	default:
		return false, nil
	}
}

// WaitHealthy polls /health until it answers 200, the process exits, or
// ctx is done.
func (w *Worker) WaitHealthy(ctx context.Context) error {
	client := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, w.URL+"/health", nil)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-w.done:
			_, err := w.Exited()
			return fmt.Errorf("worker %s exited before it was ready: %v", w.Name, err)
		case <-ctx.Done():
			return fmt.Errorf("worker %s not ready: %w", w.Name, ctx.Err())
		case <-tick.C:
		}
	}
}

// Stop asks the worker to finish (SIGTERM), then kills it after grace.
func (w *Worker) Stop(grace time.Duration) error {
	if exited, _ := w.Exited(); exited {
		return nil
	}
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stop worker %s: %w", w.Name, err)
	}
	select {
	case <-w.done:
		return nil
	case <-time.After(grace):
		_ = w.cmd.Process.Kill()
		<-w.done
		return fmt.Errorf("worker %s did not stop within %v; killed", w.Name, grace)
	}
}
