package stageclient

import (
	"errors"
	"io"
	"net/http"
	"testing"
)

func TestVersion(t *testing.T) {
	status, answer := http.StatusOK, `{"version":"0.21.0"}`
	c := serve(t, Config{Secret: "k"}, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/version" || r.Header.Get("Authorization") != "Bearer k" {
			t.Errorf("got %s %s %v", r.Method, r.URL.Path, r.Header)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, answer)
	})
	if v, err := c.Version(testCtx(t)); err != nil || v != "0.21.0" {
		t.Fatalf("vllm serve: %q, %v", v, err)
	}
	// A reference worker (or a proxy in front of an engine) has no /version.
	status, answer = http.StatusNotFound, `{"detail":"Not Found"}`
	if v, err := c.Version(testCtx(t)); err != nil || v != "" {
		t.Errorf("no /version: %q, %v; want no version and no error", v, err)
	}
	status, answer = http.StatusOK, `{}`
	if v, err := c.Version(testCtx(t)); err != nil || v != "" {
		t.Errorf("no version key: %q, %v", v, err)
	}
	answer = `not json`
	if _, err := c.Version(testCtx(t)); !errors.Is(err, ErrProtocol) {
		t.Errorf("not JSON: %v", err)
	}
	status, answer = http.StatusServiceUnavailable, `{"error":{"message":"engine is loading"}}`
	var ue *UpstreamError
	if _, err := c.Version(testCtx(t)); !errors.As(err, &ue) || ue.Status != http.StatusServiceUnavailable {
		t.Errorf("503: %v", err)
	}
}
