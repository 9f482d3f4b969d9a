package stageclient

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/omnipd/omnipd/reference/eccache"
	"github.com/omnipd/omnipd/reference/stageconn"
	"github.com/omnipd/omnipd/stageapi"
)

// storeWorker serves a conditioning store and an encoder cache at their
// stage API paths, as a reference worker mounts them, and records the
// headers of every request.
func storeWorker(t *testing.T, secret string) (*stageconn.Store, *eccache.Store, string, <-chan http.Header) {
	t.Helper()
	stashes := stageconn.NewStore(stageconn.Config{Secret: secret})
	encoded := eccache.NewStore(eccache.Config{})
	t.Cleanup(encoded.Close)
	mux := http.NewServeMux()
	mux.Handle(stageapi.ConditioningPath+"{key}", stashes.Handler())
	mux.Handle(stageapi.EncoderCachePath+"{key}", encoded.Handler())
	mux.Handle(stageapi.EncoderLeasePath+"{lease}", encoded.Handler())
	headers := make(chan http.Header, 16)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		headers <- r.Header.Clone()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
	})
	return stashes, encoded, hs.URL, headers
}

func stash() *stageapi.Conditioning {
	return &stageapi.Conditioning{Embed: [][]float32{{1}}, Hidden: [][]float32{{2}}, TTSPad: []float32{3}, TTSBos: []float32{4}, TTSEos: []float32{5}, TokenIDs: []int{7}, PromptTokenIDs: []int{7}}
}

// A release frees the stash under its key (a key with a slash, as the
// orchestrator makes them), carrying the deployment secret and no request
// id; a stash already gone is no error.
func TestReleaseConditioning(t *testing.T) {
	for _, custom := range []bool{false, true} {
		stashes, _, url, headers := storeWorker(t, "s3cret")
		cfg := Config{BaseURL: url, Secret: "s3cret"}
		if custom {
			cfg.HTTP = &http.Client{}
		}
		c, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := stashes.Put("req-1/decode", stash()); err != nil {
			t.Fatal(err)
		}
		if err := c.ReleaseConditioning(testCtx(t), "req-1/decode"); err != nil {
			t.Fatalf("custom client %v: release: %v", custom, err)
		}
		if n := stashes.Len(); n != 0 {
			t.Errorf("custom client %v: %d stashes left after the release", custom, n)
		}
		if h := <-headers; h.Get("Authorization") != "Bearer s3cret" || h.Get("X-Request-Id") != "" {
			t.Errorf("custom client %v: headers %v; want the secret and no request id", custom, h)
		}
		if err := c.ReleaseConditioning(testCtx(t), "req-1/decode"); err != nil {
			t.Errorf("custom client %v: a stash already gone: %v; want no error", custom, err)
		}
	}
}

// A worker that refuses the secret keeps its stash, and the release says
// why: the worker's own status.
func TestReleaseConditioningRefused(t *testing.T) {
	stashes, _, url, _ := storeWorker(t, "s3cret")
	c, err := New(Config{BaseURL: url, Secret: "wrong"})
	if err != nil {
		t.Fatal(err)
	}
	if err := stashes.Put("req-1/decode", stash()); err != nil {
		t.Fatal(err)
	}
	var ue *UpstreamError
	if err := c.ReleaseConditioning(testCtx(t), "req-1/decode"); !errors.As(err, &ue) || ue.Status != http.StatusUnauthorized {
		t.Errorf("release with the wrong secret: %v; want an *UpstreamError with status 401", err)
	}
	if n := stashes.Len(); n != 1 {
		t.Errorf("%d stashes after a refused release; want 1", n)
	}
}

// Ending a lease frees the outputs only that lease held; a lease already
// gone is no error.
func TestReleaseEncoderLease(t *testing.T) {
	_, encoded, url, _ := storeWorker(t, "")
	c, err := New(Config{BaseURL: url})
	if err != nil {
		t.Fatal(err)
	}
	for _, lease := range []string{"req-1/encoder", "req-2/encoder"} {
		if err := encoded.Put("sha256:ab", lease, &eccache.Entry{Audio: [][]float32{{1}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.ReleaseEncoderLease(testCtx(t), "req-1/encoder"); err != nil {
		t.Fatal(err)
	}
	if n := encoded.Len(); n != 1 {
		t.Errorf("%d entries after one of two leases ended; want 1", n)
	}
	if err := c.ReleaseEncoderLease(testCtx(t), "req-2/encoder"); err != nil {
		t.Fatal(err)
	}
	if n := encoded.Len(); n != 0 {
		t.Errorf("%d entries after both leases ended; want 0", n)
	}
	if err := c.ReleaseEncoderLease(testCtx(t), "req-2/encoder"); err != nil {
		t.Errorf("a lease already gone: %v; want no error", err)
	}
}
