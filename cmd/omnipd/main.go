// Command omnipd serves multi-stage omni models with prefill/decode
// disaggregation. See the README.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/omnipd/omnipd/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
