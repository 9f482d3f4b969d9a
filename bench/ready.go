package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// readyRetry is how long WaitReady waits between two probes.
const readyRetry = time.Second

// WaitReady waits, up to timeout, until cfg's server answers a one-token
// request of the benchmark's kind — after listing its model first when
// cfg.Target.Model is empty, which it then fills in — so that a benchmark
// started beside a server that is still starting measures the server,
// not its start. It is vllm bench serve's --ready-check-timeout-sec
// (vllm/benchmarks/lib/ready_checker.py at 032a8d24, wait_for_endpoint:
// the probe is a request, retried until it succeeds or the time is up).
// status, when set, is told once that the server is not ready yet.
func WaitReady(ctx context.Context, cfg *Config, timeout time.Duration, status io.Writer) error {
	client := cfg.Client
	if client == nil {
		client = NewHTTPClient(1)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	told := false
	for attempt := 0; ; attempt++ {
		err := probeReady(ctx, client, cfg, attempt)
		if err == nil {
			return nil
		}
		if !told && status != nil {
			fmt.Fprintf(status, "waiting up to %v for %s to be ready (%v)\n", timeout, cfg.Target.BaseURL, err)
			told = true
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("bench: %s was not ready within %v (--ready-check-timeout-sec): %w", cfg.Target.BaseURL, timeout, err)
			}
			return ctx.Err()
		case <-time.After(readyRetry):
		}
	}
}

// probeReady sends one readiness probe: the model listing if none is
// named yet, then a one-token request.
func probeReady(ctx context.Context, client *http.Client, cfg *Config, attempt int) error {
	if cfg.Target.Model == "" {
		m, err := FirstModel(ctx, client, cfg.Target.BaseURL, cfg.Target.APIKey)
		if err != nil {
			return err
		}
		cfg.Target.Model = m
	}
	t := cfg.Target
	t.Audio, t.IgnoreEOS = false, false
	if cfg.RunID == "" {
		cfg.RunID = newRunID()
	}
	rec := Record{RequestID: fmt.Sprintf("%s-ready-%d", cfg.RunID, attempt)}
	send(ctx, client, t, Prompt{Text: "ready?", MaxTokens: 1}, &rec, cfg.Timeout)
	if !rec.Success {
		return fmt.Errorf("a one-token request failed: %s", rec.Error)
	}
	return nil
}
