package server

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/omnipd/omnipd/orchestrator"
	"github.com/omnipd/omnipd/stageclient"
)

// crashingTalker takes a request, sends one codec frame and dies without a
// word: the way a Talker process that crashes mid-answer looks from
// omnipd, which must then free the conditioning the Talker will never
// release.
type crashingTalker struct{}

func (crashingTalker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = w.Write([]byte("data: {\"frame\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}\n\n"))
	_ = http.NewResponseController(w).Flush()
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		_ = conn.Close()
	}
}

// A Talker that dies after it took the conditioning leaves it on the
// Thinker until its TTL unless omnipd frees it: omnipd releases it as soon
// as the Talker leg fails, whether or not the Talker had begun to read.
func TestCrashedTalkerConditioningReleased(t *testing.T) {
	thinker := &recordingStage{}
	pool := func(name string, h http.Handler) *orchestrator.Pool {
		hs := httptest.NewServer(h)
		t.Cleanup(hs.Close)
		c, err := stageclient.New(stageclient.Config{BaseURL: hs.URL, Secret: secret})
		if err != nil {
			t.Fatal(err)
		}
		return &orchestrator.Pool{Name: name, Instances: []*orchestrator.Instance{{Client: c}}}
	}
	o, err := orchestrator.New(orchestrator.Config{
		Decode: pool("thinker", thinker), Logger: quiet,
		Omni: &orchestrator.Omni{Talker: pool("talker", crashingTalker{}), Code2Wav: pool("code2wav", &recordingStage{}), ConditioningLayer: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(New(Config{Orchestrator: o, ModelName: "omnipd-reference", Logger: quiet}))
	defer hs.Close()
	status, _, body := send(t, "POST", hs.URL+"/v1/chat/completions", "", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`)
	if status < 500 || !strings.Contains(body, "talker") {
		t.Errorf("with the Talker dead mid-answer: %d %s; want a 5xx naming the Talker", status, body)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		thinker.mu.Lock()
		calls := slices.Clone(thinker.calls)
		thinker.mu.Unlock()
		if slices.ContainsFunc(calls, func(c string) bool { return strings.HasPrefix(c, "DELETE ") }) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Thinker was never told to free the conditioning (calls %q): it waits for its TTL", calls)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
