package orchestrator

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/stageclient"
)

// syncBuffer is a log sink the probe's goroutines may share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) count(substr string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Count(s.b.String(), substr)
}

// An instance whose /health is fine but that refuses the deployment secret
// fails every request sent to it; the probe takes it out of rotation (and
// says why, once, however many probes see it) and puts it back once it
// takes the secret again (saying so, once).
func TestProbeTakesOutAnInstanceThatRefusesTheSecret(t *testing.T) {
	const secret = "the-deployment-secret"
	var accepts atomic.Bool
	var served atomic.Int32 // chat legs it answered
	picky := &fakeStage{answer: toolStage}
	// Like vLLM with another VLLM_API_KEY: /health open, /v1 guarded.
	guarded := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" && (!accepts.Load() || r.Header.Get("Authorization") != "Bearer "+secret) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"Unauthorized"}`))
			return
		}
		if r.URL.Path == "/v1/chat/completions" {
			served.Add(1)
		}
		picky.ServeHTTP(w, r)
	})
	good := &fakeStage{answer: toolStage}
	var instances []*Instance
	for _, h := range []http.Handler{guarded, good} {
		in := liveInstance(t, h, kvconnector.Peer{})
		c, err := stageclient.New(stageclient.Config{BaseURL: in.Client.BaseURL(), Secret: secret})
		if err != nil {
			t.Fatal(err)
		}
		in.Client = c
		instances = append(instances, in)
	}
	logs := &syncBuffer{}
	pool := &Pool{Name: "thinker", Instances: instances, Logger: slog.New(slog.NewTextHandler(logs, nil))}
	o, err := New(Config{Decode: pool, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		pool.ProbeOnce(t.Context(), 5*time.Second)
	}
	if n := logs.count("out of rotation"); n != 1 || logs.count("out of rotation: it refuses omnipd's deployment secret") != 1 {
		t.Errorf("after 3 probes, %d lines about the instance leaving rotation; want 1, saying it refuses the secret:\n%s", n, logs.b.String())
	}
	for i := range 4 {
		if err := drive(t, o, wholeChat); err != nil {
			t.Errorf("request %d, with the instance that refuses the secret out of rotation: %v", i, err)
		}
	}
	if n := served.Load(); n != 0 {
		t.Errorf("the instance that refuses the secret answered %d requests", n)
	}

	accepts.Store(true)
	for range 2 {
		pool.ProbeOnce(t.Context(), 5*time.Second)
	}
	if n := logs.count("back in rotation"); n != 1 {
		t.Errorf("%d lines about the instance coming back, want 1:\n%s", n, logs.b.String())
	}
	for i := range 4 {
		if err := drive(t, o, wholeChat); err != nil {
			t.Errorf("request %d: %v", i, err)
		}
	}
	if n := served.Load(); n == 0 {
		t.Error("the instance that takes the secret again was sent nothing: it is still out of rotation")
	}
}
