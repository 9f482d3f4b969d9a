package worker

import (
	"bytes"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A handler that fails after its answer began (a stream under way) gets no
// error body written into the middle of that answer: the answer stays what
// was sent, and net/http is not asked for a second status.
func TestFailureAfterTheAnswerBeganLeavesItAlone(t *testing.T) {
	w := newPlainWorker(t, 0)
	var complaints bytes.Buffer
	hs := httptest.NewUnstartedServer(w.handle(func(rw http.ResponseWriter, r *http.Request) error {
		rw.Header().Set("Content-Type", "text/event-stream")
		rw.WriteHeader(http.StatusOK)
		io.WriteString(rw, "data: {\"choices\":[]}\n\n")
		return errors.New("the engine failed mid-stream")
	}))
	hs.Config.ErrorLog = log.New(&complaints, "", 0)
	hs.Start()
	defer hs.Close()
	resp, err := http.Get(hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "data: {\"choices\":[]}\n\n" {
		t.Errorf("answer %d %q; want the stream as it was sent", resp.StatusCode, body)
	}
	hs.Close()
	if strings.Contains(complaints.String(), "superfluous") {
		t.Errorf("net/http: %s", complaints.String())
	}
}
