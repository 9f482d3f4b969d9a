package stageclient

import (
	"errors"
	"io"
	"net/http"
	"testing"
)

func TestMaxModelLen(t *testing.T) {
	answer := `{"object":"list","data":[{"id":"Qwen/Qwen3-8B","object":"model","max_model_len":40960}]}`
	c := serve(t, Config{Secret: "k"}, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/v1/models" || r.Header.Get("Authorization") != "Bearer k" {
			t.Errorf("got %s %s %v", r.Method, r.URL.Path, r.Header)
		}
		if answer == "" {
			// vllm serve --api-key refusing a caller without the key.
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"error":"Unauthorized"}`)
			return
		}
		_, _ = io.WriteString(w, answer)
	})
	n, err := c.MaxModelLen(testCtx(t))
	if err != nil || n != 40960 {
		t.Fatalf("got %d, %v", n, err)
	}
	answer = `{"object":"list","data":[]}`
	if n, err := c.MaxModelLen(testCtx(t)); err != nil || n != 0 {
		t.Errorf("no models: %d, %v", n, err)
	}
	answer = `not json`
	if _, err := c.MaxModelLen(testCtx(t)); !errors.Is(err, ErrProtocol) {
		t.Errorf("not JSON: %v", err)
	}
	answer = ""
	_, err = c.MaxModelLen(testCtx(t))
	var ue *UpstreamError
	if !errors.As(err, &ue) || ue.Status != http.StatusUnauthorized || ue.Retryable() || ue.Body.Detail.Message != "Unauthorized" {
		t.Errorf("refused: %v", err)
	}
}
