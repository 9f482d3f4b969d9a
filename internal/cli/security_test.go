package cli

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/reference/engine"
	"github.com/omnipd/omnipd/reference/engine/model"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
	"github.com/omnipd/omnipd/reference/worker"
)

// serve and worker listen on loopback unless told otherwise.
func TestListenDefaultsAreLoopback(t *testing.T) {
	for name, host := range map[string]string{
		"serve":  newServeCmd().Flags().Lookup("host").DefValue,
		"worker": newWorkerCmd().Flags().Lookup("host").DefValue,
	} {
		if !isLoopback(host) {
			t.Errorf("omnipd %s listens on %q by default, want a loopback address", name, host)
		}
	}
	for host, want := range map[string]bool{"127.0.0.1": true, "::1": true, "localhost": true, "127.0.0.2": true,
		"": false, "0.0.0.0": false, "::": false, "10.0.0.5": false, "example.com": false} {
		if got := isLoopback(host); got != want {
			t.Errorf("isLoopback(%q) = %v, want %v", host, got, want)
		}
	}
}

func logTo(b *bytes.Buffer) *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// Listening beyond loopback without an API key, or running a worker
// without a secret, is warned about; the guarded or local cases are quiet.
func TestExposureWarnings(t *testing.T) {
	for _, c := range []struct {
		host, key string
		warn      bool
	}{
		{"0.0.0.0", "", true},
		{"10.0.0.5", "", true},
		{"0.0.0.0", "k", false},
		{"127.0.0.1", "", false},
	} {
		var b bytes.Buffer
		(&accessOptions{apiKey: c.key}).warnExposure(c.host, logTo(&b))
		if got := strings.Contains(b.String(), "without an API key"); got != c.warn {
			t.Errorf("serve on %q with key %q: warned %v, want %v: %s", c.host, c.key, got, c.warn, b.String())
		}
		if c.key != "" && strings.Contains(b.String(), c.key) {
			t.Errorf("the key reached the log: %s", b.String())
		}
	}
	for _, c := range []struct {
		host, secret, want string
	}{
		{"127.0.0.1", "", "any process on this host can use this worker"},
		{"0.0.0.0", "", "anyone who can reach this host (listening on 0.0.0.0) can use this worker"},
		{"0.0.0.0", "s3", ""},
	} {
		var b bytes.Buffer
		warnWorkerExposure(c.host, c.secret, logTo(&b))
		if c.want == "" && b.Len() != 0 || !strings.Contains(b.String(), c.want) {
			t.Errorf("worker on %q with secret %q logged %q, want %q", c.host, c.secret, b.String(), c.want)
		}
	}
}

// The deployment secret: --secret-file, else $OMNIPD_SECRET, else none (with
// a warning) when some engine is already running, else a fresh one.
func TestDeploymentSecret(t *testing.T) {
	started := &deploy.Document{}
	running := &deploy.Document{}
	if err := yamlDoc(t, running, "endpoints: [http://127.0.0.1:1]"); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	t.Setenv("OMNIPD_SECRET", "")
	if s, err := deploymentSecret(started, "", logTo(&b)); err != nil || len(s) < 32 {
		t.Errorf("generated: %q %v", s, err)
	}
	if s, err := deploymentSecret(running, "", logTo(&b)); err != nil || s != "" || !strings.Contains(b.String(), "no deployment secret") {
		t.Errorf("running engines, no secret: %q %v %s", s, err, b.String())
	}
	t.Setenv("OMNIPD_SECRET", "from-env")
	if s, _ := deploymentSecret(running, "", logTo(&b)); s != "from-env" {
		t.Errorf("from the environment: %q", s)
	}
	file := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(file, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, _ := deploymentSecret(running, file, logTo(&b)); s != "from-file" {
		t.Errorf("from the file: %q", s)
	}
	if err := os.WriteFile(file, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := deploymentSecret(running, file, logTo(&b)); err == nil {
		t.Error("an empty secret file was accepted")
	}
}

// yamlDoc loads a one-stage colocated config whose stage has the given
// extra line.
func yamlDoc(t *testing.T, dst *deploy.Document, line string) error {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "deploy.yaml")
	if err := os.WriteFile(cfg, []byte("pipeline: qwen3_omni_moe_thinker\nstages:\n  - stage_id: 0\n    "+line+"\n"), 0o644); err != nil {
		return err
	}
	doc, _, err := deploy.LoadFile(cfg, deploy.Options{})
	if err != nil {
		return err
	}
	*dst = *doc
	return nil
}

// securedWorker is a running reference worker that requires secret.
func securedWorker(t *testing.T, kv, secret string) string {
	t.Helper()
	eng, err := engine.New(model.Default(), tokenizer.Default(), engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { eng.Run(ctx); close(done) }()
	cfg, err := worker.ParseKVTransferConfig(kv)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := worker.New(worker.Config{Engine: eng, KV: cfg, Secret: secret, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { hs.Close(); srv.Close(); cancel(); <-done })
	return hs.URL
}

// runServe runs `omnipd serve args...` until the test ends and returns its
// base URL.
func runServe(t *testing.T, args ...string) string {
	t.Helper()
	url, _ := runServeLogged(t, args...)
	return url
}

func askCompletion(t *testing.T, url, key string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/completions", strings.NewReader(`{"prompt":"Hello there","max_tokens":2}`))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	return roundTrip(t, req)
}

// roundTrip sends req and returns the answer's status and body.
func roundTrip(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// serve --config with running engines that require a secret: serve takes
// it from OMNIPD_SECRET or --secret-file and sends it on every leg; without
// it the client gets a 502 that names the refusal, not a 401. --api-key (or
// OMNIPD_API_KEY; the flag wins) guards the API.
func TestServeSecretAndAPIKey(t *testing.T) {
	const secret = "deployment-s3cret"
	prefill := securedWorker(t, `{"kv_connector":"ReferenceConnector","kv_role":"kv_producer","engine_id":"p0","kv_port":0}`, secret)
	decode := securedWorker(t, `{"kv_connector":"ReferenceConnector","kv_role":"kv_consumer","engine_id":"d0"}`, secret)
	cfg := writeEndpointsConfig(t, prefill, decode)
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Setenv("OMNIPD_SECRET", "")
	t.Setenv("OMNIPD_API_KEY", "")
	noSecret := runServe(t, "--config", cfg)
	if status, body := askCompletion(t, noSecret, ""); status != 502 || !strings.Contains(body, "prefill_unauthorized") {
		t.Errorf("without the deployment secret: %d %s", status, body)
	}

	withFile := runServe(t, "--config", cfg, "--secret-file", secretFile)
	if status, body := askCompletion(t, withFile, ""); status != 200 {
		t.Errorf("with --secret-file: %d %s", status, body)
	}

	t.Setenv("OMNIPD_SECRET", secret)
	t.Setenv("OMNIPD_API_KEY", "env-key")
	withEnvKey := runServe(t, "--config", cfg)
	for key, want := range map[string]int{"": 401, "wrong": 401, "env-key": 200} {
		if status, body := askCompletion(t, withEnvKey, key); status != want {
			t.Errorf("OMNIPD_API_KEY set, request with key %q: %d %s, want %d", key, status, body, want)
		}
	}
	withFlagKey := runServe(t, "--config", cfg, "--api-key", "flag-key")
	for key, want := range map[string]int{"env-key": 401, "flag-key": 200} {
		if status, body := askCompletion(t, withFlagKey, key); status != want {
			t.Errorf("--api-key beside OMNIPD_API_KEY, request with key %q: %d %s, want %d", key, status, body, want)
		}
	}
}

// omnipd chat sends --api-key, else $OMNIPD_API_KEY, and never prints it.
func TestChatAPIKey(t *testing.T) {
	var got []string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Authorization"))
		_, _ = io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}`)
	}))
	defer hs.Close()
	t.Setenv("OMNIPD_API_KEY", "env-key")
	var stdout, stderr bytes.Buffer
	for _, args := range [][]string{
		{"chat", "--url", hs.URL, "Hi"},
		{"chat", "--url", hs.URL, "--api-key", "flag-key", "Hi"},
	} {
		if code := Run(context.Background(), args, &stdout, &stderr); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr.String())
		}
	}
	if len(got) != 2 || got[0] != "Bearer env-key" || got[1] != "Bearer flag-key" {
		t.Errorf("Authorization sent: %q", got)
	}
	stdout.Reset()
	if code := Run(context.Background(), []string{"chat", "--help"}, &stdout, &stderr); code != 0 || strings.Contains(stdout.String(), "env-key") {
		t.Errorf("chat --help (exit %d) prints the key:\n%s", code, stdout.String())
	}
	stdout.Reset()
	if code := Run(context.Background(), []string{"serve", "--help"}, &stdout, &stderr); code != 0 || strings.Contains(stdout.String(), "env-key") {
		t.Errorf("serve --help (exit %d) prints the key:\n%s", code, stdout.String())
	}
}
