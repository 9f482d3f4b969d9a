package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A key on the command line is in ps for every user of the host: serve and
// worker take it (it is the user's choice) but say so, once, without
// printing it.
func TestKeyOnTheCommandLineWarns(t *testing.T) {
	t.Setenv("OMNIPD_SECRET", "")
	t.Setenv("OMNIPD_API_KEY", "")
	prefill := securedWorker(t, `{"kv_connector":"ReferenceConnector","kv_role":"kv_producer","engine_id":"p0","kv_port":0}`, "")
	decode := securedWorker(t, `{"kv_connector":"ReferenceConnector","kv_role":"kv_consumer","engine_id":"d0"}`, "")
	cfg := writeEndpointsConfig(t, prefill, decode)

	_, logs := runServeLogged(t, "--config", cfg, "--api-key", "flag-key-123")
	if l := logs.String(); strings.Count(l, "on the command line") != 1 || !strings.Contains(l, "OMNIPD_API_KEY") || strings.Contains(l, "flag-key-123") {
		t.Errorf("serve --api-key: want one warning naming OMNIPD_API_KEY and not the key:\n%s", l)
	}
	t.Setenv("OMNIPD_API_KEY", "env-key-123")
	_, logs = runServeLogged(t, "--config", cfg)
	if l := logs.String(); strings.Contains(l, "on the command line") {
		t.Errorf("a key from the environment was warned about:\n%s", l)
	}

	ctx, cancel := context.WithCancel(context.Background())
	out, errOut := &lockedBuffer{}, &lockedBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"worker", "--stage", "talker", "--port", "0", "--secret", "worker-s3cret"}, out, errOut)
	}()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(errOut.String(), "worker listening") && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
	}
	cancel()
	<-done
	if l := errOut.String(); strings.Count(l, "on the command line") != 1 || !strings.Contains(l, "OMNIPD_SECRET") || strings.Contains(l, "worker-s3cret") {
		t.Errorf("worker --secret: want one warning naming OMNIPD_SECRET and not the secret:\n%s", l)
	}
}

// A secret file others can read is no secret: serve warns as ssh does about
// a private key, naming the file and its mode.
func TestSecretFileReadableByOthersWarns(t *testing.T) {
	prefill := securedWorker(t, `{"kv_connector":"ReferenceConnector","kv_role":"kv_producer","engine_id":"p0","kv_port":0}`, "s3")
	decode := securedWorker(t, `{"kv_connector":"ReferenceConnector","kv_role":"kv_consumer","engine_id":"d0"}`, "s3")
	cfg := writeEndpointsConfig(t, prefill, decode)
	t.Setenv("OMNIPD_SECRET", "")
	for _, tc := range []struct {
		mode os.FileMode
		warn bool
	}{{0o644, true}, {0o640, true}, {0o600, false}, {0o400, false}} {
		file := filepath.Join(t.TempDir(), "secret")
		if err := os.WriteFile(file, []byte("s3\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(file, tc.mode); err != nil {
			t.Fatal(err)
		}
		_, logs := runServeLogged(t, "--config", cfg, "--secret-file", file)
		l := logs.String()
		if got := strings.Contains(l, "readable by other users"); got != tc.warn || (tc.warn && !strings.Contains(l, file)) {
			t.Errorf("mode %04o: warned %v, want %v:\n%s", tc.mode, got, tc.warn, l)
		}
	}
}
