package worker

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/omnipd/omnipd/reference/engine"
)

// recordingListener keeps what each Write on its connections wrote: one
// entry per write(2) of the server.
type recordingListener struct {
	net.Listener
	mu     sync.Mutex
	writes [][]byte
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &recordingConn{Conn: c, l: l}, nil
}

func (l *recordingListener) recorded() [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([][]byte(nil), l.writes...)
}

type recordingConn struct {
	net.Conn
	l *recordingListener
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.l.mu.Lock()
	c.l.writes = append(c.l.writes, bytes.Clone(p))
	c.l.mu.Unlock()
	return c.Conn.Write(p)
}

// A stream's end — the last chunk, the usage, [DONE] and the end of the
// HTTP body — leaves the worker in one write: the write that carries
// [DONE] is the response's last.
func TestStreamEndsInOneWrite(t *testing.T) {
	eng := runTestEngine(t, engine.Config{})
	srv, err := New(Config{Engine: eng, Secret: testSecret, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(srv)
	l := &recordingListener{Listener: hs.Listener}
	hs.Listener = l
	hs.Start()
	t.Cleanup(func() { hs.Close(); srv.Close() })

	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		t.Run(path, func(t *testing.T) {
			before := len(l.recorded())
			body := `{"prompt":"Hello","max_tokens":8,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}`
			if strings.Contains(path, "chat") {
				body = `{"messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}`
			}
			req, _ := http.NewRequest("POST", hs.URL+path, strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+testSecret)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 || !bytes.HasSuffix(got, []byte("data: [DONE]\n\n")) {
				t.Fatalf("HTTP %d, %v: %s", resp.StatusCode, err, got)
			}
			// The client has read the whole body, so every write of the
			// response is recorded.
			writes := l.recorded()[before:]
			last := writes[len(writes)-1]
			if !bytes.Contains(last, []byte("data: [DONE]")) {
				t.Errorf("the response's last write is %q, not the one with [DONE]: the end of the body took a write of its own", last)
			}
			if !bytes.Contains(last, []byte(`"usage":{"prompt_tokens"`)) {
				t.Errorf("the usage chunk did not leave with [DONE]: %q", last)
			}
		})
	}
}
