package orchestrator

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/stageclient"
)

// refusedURL is a loopback address nothing listens on: connecting to it is
// refused, as to an engine that was never started.
func refusedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close()
	return url
}

// A stage that cannot be reached is named as such, with its URL — not
// reported as a worker omnipd is restarting, which an external engine that
// was never up is not.
func TestUnreachableStageIsNamed(t *testing.T) {
	for _, disaggregated := range []bool{false, true} {
		url := refusedURL(t)
		c, err := stageclient.New(stageclient.Config{BaseURL: url})
		if err != nil {
			t.Fatal(err)
		}
		pool := &Pool{Name: "decode", Instances: []*Instance{{Client: c}}}
		cfg := Config{Decode: pool, Logger: slog.New(slog.DiscardHandler)}
		if disaggregated {
			o := newOrch(t, vllmStage(everyHandoffKey), vllmStage(everyHandoffKey), "NixlConnector")
			cfg.Contract = o.cfg.Contract
			cfg.Prefill, cfg.Decode = pool, o.cfg.Decode
			pool.Name = "prefill"
		}
		o, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		_, err = o.Do(context.Background(), chatRequest(t, "r", `{"messages":[{"role":"user","content":"hi"}]}`))
		var oe *Error
		if !errors.As(err, &oe) {
			t.Fatalf("disaggregated %v: err = %v, want an *Error", disaggregated, err)
		}
		if oe.Status < 502 || oe.Status > 503 || !strings.Contains(oe.Msg, url) || !strings.Contains(oe.Msg, "unreachable") || strings.Contains(oe.Msg, "restarting") {
			t.Errorf("disaggregated %v: %d %s %q; want a 502 or 503 naming %s as unreachable", disaggregated, oe.Status, oe.Code, oe.Msg, url)
		}
	}
}
