package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"
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

// serveHTTP listens on host:port and serves h on it (serveListener).
func serveHTTP(ctx context.Context, host string, port int, h http.Handler, drain time.Duration, listening func(net.Addr), stopping func()) error {
	ln, err := listen(host, port)
	if err != nil {
		return err
	}
	return serveListener(ctx, ln, h, drain, listening, stopping)
}

// serveListener calls listening with ln's address and serves h on ln until
// ctx ends; then it stops accepting and lets requests in flight finish for
// up to drain.
func serveListener(ctx context.Context, ln net.Listener, h http.Handler, drain time.Duration, listening func(net.Addr), stopping func()) error {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	listening(ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
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

// serveHandler serves a worker's handler, draining for up to 10 s.
func serveHandler(ctx context.Context, host string, port int, h http.Handler, log *slog.Logger, stage string) error {
	return serveHTTP(ctx, host, port, h, 10*time.Second, func(a net.Addr) {
		log.Info("worker listening", "addr", a.String(), "stage", stage)
	}, nil)
}
