package cli

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// omnipd worker --stage talker|code2wav --simulate paces the audio stage by
// the profile: the startup line names it, and a profile that does not load
// stops the worker.
func TestAudioWorkerSimulate(t *testing.T) {
	t.Setenv("OMNIPD_SECRET", "")
	for _, stage := range []string{"talker", "code2wav"} {
		ctx, cancel := context.WithCancel(context.Background())
		logs := &lockedBuffer{}
		done := make(chan int, 1)
		go func() {
			done <- Run(ctx, []string{"worker", "--stage", stage, "--port", "0", "--simulate", "h100-qwen3-omni-30b-a3b"}, io.Discard, logs)
		}()
		want := stage + ` worker" simulate=h100-qwen3-omni-30b-a3b`
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), want) && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		}
		if !strings.Contains(logs.String(), want) {
			t.Errorf("%s: the startup log does not name the profile (want %q):\n%s", stage, want, logs.String())
		}
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the worker did not stop", stage)
		}
		bounded, stop := context.WithTimeout(context.Background(), 5*time.Second)
		if code := Run(bounded, []string{"worker", "--stage", stage, "--port", "0", "--simulate", "h200-nope"}, io.Discard, io.Discard); code == 0 || bounded.Err() != nil {
			t.Errorf("%s: an unknown profile was accepted", stage)
		}
		stop()
	}
}
