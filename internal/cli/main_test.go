package cli

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// asOmnipd, set in a test's environment, makes the test binary that a
// serve under test starts (os.Executable) run as omnipd itself, so that
// serve's reference workers are real processes here too.
const asOmnipd = "OMNIPD_CLI_TEST_AS_OMNIPD"

func TestMain(m *testing.M) {
	if os.Getenv(asOmnipd) != "" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Exit(m.Run())
}
