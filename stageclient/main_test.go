package stageclient

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
)

// TestMain fails the run if any test left a goroutine behind — a stream
// whose connection was never torn down, a handler still blocked — once the
// shared transport's idle connections are closed.
func TestMain(m *testing.M) {
	flag.Parse()
	base := runtime.NumGoroutine()
	code := m.Run()
	// The fuzzing engine starts goroutines of its own (a signal handler).
	if code == 0 && flag.Lookup("test.fuzz").Value.String() == "" {
		if n, ok := settleGoroutines(base, 5*time.Second); !ok {
			fmt.Fprintf(os.Stderr, "goroutine leak: %d running, %d before the tests\n%s\n", n, base, goroutineDump())
			code = 1
		}
	}
	os.Exit(code)
}

// settleGoroutines closes idle connections and waits for the goroutine
// count to fall back to base: connection goroutines exit asynchronously.
func settleGoroutines(base int, wait time.Duration) (int, bool) {
	deadline := time.Now().Add(wait)
	for {
		sharedHTTP.CloseIdleConnections()
		n := runtime.NumGoroutine()
		if n <= base {
			return n, true
		}
		if time.Now().After(deadline) {
			return n, false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func goroutineDump() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}
