package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/spf13/cobra"
)

// registerDebugAddr adds --debug-addr to every command: Go's profiler
// (net/http/pprof) on a listener of its own, never on the API's port, so
// profiling a live server needs no rebuild and exposes nothing by default.
func registerDebugAddr(root *cobra.Command) {
	var addr string
	root.PersistentFlags().StringVar(&addr, "debug-addr", "", "serve Go's profiler (/debug/pprof/) on this address, e.g. 127.0.0.1:6060 (default: off)")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if addr == "" {
			return nil
		}
		return startDebugServer(cmd.Context(), addr, cmd.ErrOrStderr())
	}
}

// startDebugServer serves the profiler on addr until ctx ends.
func startDebugServer(ctx context.Context, addr string, stderr io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--debug-addr: %w", err)
	}
	if host, _, _ := net.SplitHostPort(addr); !isLoopback(host) {
		fmt.Fprintf(stderr, "omnipd: --debug-addr %s is not a loopback address: anyone who can reach it can profile this process\n", addr)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	fmt.Fprintf(stderr, "omnipd: profiler on http://%s/debug/pprof/\n", ln.Addr())
	return nil
}

// childDebugAddr is the profiler address of a worker started by a command
// whose own profiler is on addr: the same host, a port the kernel picks.
func childDebugAddr(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, "0")
}
