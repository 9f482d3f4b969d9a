package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/omnipd/omnipd/server"
)

// listen binds host:port. A port that is taken fails here, naming it, so
// that serve can bind its API before it starts any worker.
func listen(host string, port int) (net.Listener, error) {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return ln, nil
}

// inheritedListener is the listening TCP socket at file descriptor fd, which
// the process that started this one bound for it and passed down (omnipd
// serve, for the workers it starts: launch.Spec.Listener). flag names the
// descriptor in errors.
func inheritedListener(fd int, flag string) (*net.TCPListener, error) {
	if fd < 3 {
		return nil, fmt.Errorf("%s %d: want an inherited descriptor, 3 or above (0-2 are standard input, output and error)", flag, fd)
	}
	f := os.NewFile(uintptr(fd), flag)
	defer f.Close() // the listener holds a descriptor of its own
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("%s %d: %w", flag, fd, err)
	}
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		ln.Close()
		return nil, fmt.Errorf("%s %d: a %s socket; want a listening TCP socket", flag, fd, ln.Addr().Network())
	}
	return tl, nil
}

// serveListenerWith calls listening with ln's address and serves h on ln,
// as server.NewHTTPServer and server.LimitListener build it with hc, until
// ctx ends; then it stops accepting and lets requests in flight finish for
// up to drain.
func serveListenerWith(ctx context.Context, ln net.Listener, h http.Handler, hc server.HTTPConfig, drain time.Duration, listening func(net.Addr), stopping func()) error {
	hs := server.NewHTTPServer(h, hc)
	listening(ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(server.LimitListener(ln, hc)) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	if stopping != nil {
		stopping()
	}
	shutdown, done := context.WithTimeout(context.Background(), drain)
	defer done()
	if err := hs.Shutdown(shutdown); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// workerHTTP is a stage worker's HTTP limits: the defaults but for the cap
// per client address, since a worker's clients are omnipd's orchestrator
// and Talker — a few addresses that carry every request of the deployment.
var workerHTTP = server.HTTPConfig{MaxConnsPerIP: -1}

// serveHandler serves a worker's handler on ln, or else on host:port bound
// now, draining for up to 10 s.
func serveHandler(ctx context.Context, ln net.Listener, host string, port int, h http.Handler, log *slog.Logger, stage string) error {
	if ln == nil {
		var err error
		if ln, err = listen(host, port); err != nil {
			return err
		}
	}
	return serveListenerWith(ctx, ln, h, workerHTTP, 10*time.Second, func(a net.Addr) {
		log.Info("worker listening", "addr", a.String(), "stage", stage)
	}, nil)
}
