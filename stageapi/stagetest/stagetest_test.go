package stagetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/reference/engine"
	"github.com/omnipd/omnipd/reference/engine/code2wav"
	"github.com/omnipd/omnipd/reference/engine/model"
	"github.com/omnipd/omnipd/reference/engine/talker"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
	"github.com/omnipd/omnipd/reference/worker"
	"github.com/omnipd/omnipd/stageapi"
)

// recorder is a reporter that keeps what a check reports instead of
// failing the test: Fatalf ends the check by a panic that runRecorded
// recovers.
type recorder struct {
	mu     sync.Mutex
	errors []string
}

type recordedFatal struct{}

var _ reporter = (*recorder)(nil)

func (r *recorder) Helper()             {}
func (r *recorder) Logf(string, ...any) {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	panic(recordedFatal{})
}

// runRecorded runs the named check against d and returns what it
// reported. Its instances live as long as t.
func runRecorded(t *testing.T, d Deployment, name string) []string {
	t.Helper()
	i := -1
	for j, ch := range checks {
		if ch.name == name {
			i = j
		}
	}
	if i < 0 {
		t.Fatalf("no check %q", name)
	}
	rec := &recorder{}
	c := newChecker(rec, t, d)
	defer c.close()
	func() {
		defer func() {
			if v := recover(); v != nil {
				if _, ok := v.(recordedFatal); !ok {
					panic(v)
				}
			}
		}()
		checks[i].run(c)
	}()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.errors
}

var (
	refModel     = model.Default()
	refTokenizer = tokenizer.Default()
)

const refSecret = "stagetest-secret"

// faults says how each role's reference worker is broken: a wrapper
// around its handler; a role without one serves as it is.
type faults map[string]func(http.Handler) http.Handler

// serve puts h, wrapped as faults say for role, on a loopback port.
func (f faults) serve(t *testing.T, role string, h http.Handler) string {
	if wrap := f[role]; wrap != nil {
		h = wrap(h)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	return hs.URL
}

func referenceThinker(t *testing.T, kv string, maxModelLen int) *worker.Server {
	eng, err := engine.New(refModel, refTokenizer, engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { eng.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	cfg, err := worker.ParseKVTransferConfig(kv)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := worker.New(worker.Config{Engine: eng, KV: cfg, Secret: refSecret, MaxModelLen: maxModelLen, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv
}

// brokenDeployment is the reference deployment (pull handshake) with the
// given faults.
func brokenDeployment(t *testing.T, f faults, maxModelLen int) Deployment {
	contract, err := kvconnector.NewRegistry().Lookup(kvconnector.ReferenceConnector, nil)
	if err != nil {
		t.Fatal(err)
	}
	kv := func(role, id string) string {
		return fmt.Sprintf(`{"kv_connector":"ReferenceConnector","kv_role":%q,"engine_id":%q,"kv_ip":"127.0.0.1","kv_port":0}`, role, id)
	}
	quiet := slog.New(slog.DiscardHandler)
	return Deployment{
		Secret: refSecret, Model: "omnipd-reference", Layer: 2,
		Thinker: func(t *testing.T) string { return f.serve(t, "thinker", referenceThinker(t, "", maxModelLen)) },
		PD: func(t *testing.T) Pair {
			return Pair{
				Prefill: f.serve(t, "prefill", referenceThinker(t, kv("kv_producer", "prefill-0"), maxModelLen)),
				Decode:  f.serve(t, "decode", referenceThinker(t, kv("kv_consumer", "decode-0"), maxModelLen)),
				KV:      contract,
			}
		},
		Talker: func(t *testing.T) string {
			return f.serve(t, "talker", worker.NewTalker(talker.Default(), talker.DefaultSegmenter(), refSecret, quiet))
		},
		Code2Wav: func(t *testing.T) string {
			return f.serve(t, "code2wav", worker.NewCode2Wav(code2wav.Default(), refSecret, quiet))
		},
	}
}

// rewriteStashReads serves a stash read and hands its body and header to
// rewrite before they go out; every other request passes through.
func rewriteStashReads(rewrite func(body []byte, h http.Header) []byte) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet || !strings.HasPrefix(r.URL.Path, stageapi.ConditioningPath) {
				next.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, r)
			body := rec.Body.Bytes()
			if rec.Code == http.StatusOK {
				body = rewrite(body, rec.Header())
			}
			maps.Copy(w.Header(), rec.Header())
			w.WriteHeader(rec.Code)
			_, _ = w.Write(body)
		})
	}
}

var doneFrames = regexp.MustCompile(`"done":true,"frames":(\d+)`)

// Each check reports a worker that breaks what it pins, and passes the
// same worker unbroken: the suite can fail, and fails for the breakage.
func TestConformanceChecksCatchBrokenWorkers(t *testing.T) {
	for _, tc := range []struct {
		fault  string
		check  string
		faults faults
		// maxModelLen, when set, bounds the broken worker's context, so
		// that one that does not stop a request finishes it soon.
		maxModelLen int
		want        string // in one of the reported errors
	}{
		{
			fault: "a Thinker that answers without the secret", check: "Secret",
			faults: faults{"thinker": func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					r.Header.Set("Authorization", "Bearer "+refSecret)
					next.ServeHTTP(w, r)
				})
			}},
			want: "want 401",
		},
		{
			fault: "a stash body shorter than its header", check: "ConditioningBatch",
			faults: faults{"thinker": rewriteStashReads(func(b []byte, _ http.Header) []byte { return b[:len(b)-4] })},
			want:   "its header",
		},
		{
			fault: "a decode stash without the duplicate row", check: "PDEqualsColocated",
			faults: faults{"decode": rewriteStashReads(func(b []byte, _ http.Header) []byte {
				st, err := stageapi.DecodeConditioning(b)
				if err != nil || len(st.Embed) == 0 {
					return b
				}
				st.Embed, st.Hidden = st.Embed[1:], st.Hidden[1:]
				out, _ := stageapi.EncodeConditioning(st)
				return out
			})},
			want: "prefill[0:P] ++ decode[1:]",
		},
		{
			fault: "a streamed stash that says done on its first read", check: "ConditioningStreamed",
			faults: faults{"thinker": rewriteStashReads(func(b []byte, h http.Header) []byte {
				if h.Get(stageapi.ConditioningDoneHeader) != "" {
					h.Set(stageapi.ConditioningDoneHeader, "true")
				}
				return b
			})},
			want: "streamed layer-0 rows differ",
		},
		{
			fault: "a Talker whose done event miscounts its frames", check: "Talker",
			faults: faults{"talker": func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					rec := httptest.NewRecorder()
					next.ServeHTTP(rec, r)
					body := doneFrames.ReplaceAllFunc(rec.Body.Bytes(), func(m []byte) []byte {
						n, _ := strconv.Atoi(string(doneFrames.FindSubmatch(m)[1]))
						return fmt.Appendf(nil, `"done":true,"frames":%d`, n+1)
					})
					maps.Copy(w.Header(), rec.Header())
					w.WriteHeader(rec.Code)
					_, _ = w.Write(body)
				})
			}},
			want: "the done event says",
		},
		{
			fault: "a Code2Wav that ignores context_frames", check: "Code2Wav",
			faults: faults{"code2wav": func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					var req map[string]any
					raw, _ := io.ReadAll(r.Body)
					if json.Unmarshal(raw, &req) == nil {
						req["context_frames"] = 0
						raw, _ = json.Marshal(req)
					}
					r.Body = io.NopCloser(bytes.NewReader(raw))
					r.ContentLength = int64(len(raw))
					next.ServeHTTP(w, r)
				})
			}},
			want: "1920 per new frame",
		},
		{
			fault: "a Thinker that goes on after its client left", check: "DisconnectThinker",
			faults: faults{"thinker": func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					next.ServeHTTP(w, r.WithContext(context.WithoutCancel(r.Context())))
				})
			}},
			maxModelLen: 160,
			want:        "after the client went away",
		},
	} {
		t.Run(tc.check, func(t *testing.T) {
			broken := runRecorded(t, brokenDeployment(t, tc.faults, tc.maxModelLen), tc.check)
			found := false
			for _, e := range broken {
				found = found || strings.Contains(e, tc.want)
			}
			t.Logf("%s against %s reported:\n\t%s", tc.check, tc.fault, strings.Join(broken, "\n\t"))
			if !found {
				t.Errorf("%s against %s: reported %q; want an error saying %q", tc.check, tc.fault, broken, tc.want)
			}
			if sound := runRecorded(t, brokenDeployment(t, nil, 0), tc.check); len(sound) != 0 {
				t.Errorf("%s against the same worker unbroken: %q", tc.check, sound)
			}
		})
	}
}

// The framing reader refuses what vLLM's SSE framing is not.
func TestConformanceSSEFraming(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		events     int
		ok         bool
	}{
		{"events and [DONE]", "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n", 2, true},
		{"a comment between", ": ping\n\ndata: {}\n\ndata: [DONE]\n\n", 1, true},
		{"no [DONE]", "data: {}\n\n", 0, false},
		{"an event after [DONE]", "data: [DONE]\n\ndata: {}\n\n", 0, false},
		{"two data lines in one event", "data: {}\ndata: {}\n\ndata: [DONE]\n\n", 0, false},
		{"[DONE] not ended", "data: {}\n\ndata: [DONE]", 0, false},
		{"no space after data:", "data:{}\n\ndata:[DONE]\n\n", 1, true},
		{"another field", "event: x\ndata: {}\n\ndata: [DONE]\n\n", 0, false},
	} {
		events, err := readSSE(strings.NewReader(tc.body))
		if (err == nil) != tc.ok || (tc.ok && len(events) != tc.events) {
			t.Errorf("%s: %d events, %v; want %d, ok %v", tc.name, len(events), err, tc.events, tc.ok)
		}
	}
}
