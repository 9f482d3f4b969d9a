package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/launch"
	"github.com/omnipd/omnipd/topology"
	"github.com/omnipd/omnipd/wiring"
)

// thinkerPDConfig is a Thinker split into prefill and decode over the
// reference connector, with no port chosen: every worker port and KV side
// channel is one serve picks.
const thinkerPDConfig = `pipeline: qwen3_omni_moe_thinker
stages:
  - stage_id: 0
    devices: "0,1"
pd: {connector: ReferenceConnector}
`

func writeThinkerPDConfig(t *testing.T) string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "deploy.yaml")
	if err := os.WriteFile(cfg, []byte(thinkerPDConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// untilDeadline is a context that ends a little before the test's
// deadline, leaving room to report what was waited for.
func untilDeadline(t *testing.T) context.Context {
	deadline, ok := t.Deadline()
	if !ok {
		return t.Context()
	}
	ctx, cancel := context.WithDeadline(t.Context(), deadline.Add(-5*time.Second))
	t.Cleanup(cancel)
	return ctx
}

// A port serve settled stays bound from its pick to its worker: when its
// turn comes, nobody else can bind it, and the worker serves on it.
func TestTakenPortsStayBound(t *testing.T) {
	t.Setenv(asOmnipd, "1")
	doc, _, err := deploy.LoadFile(writeThinkerPDConfig(t), deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ports, err := planLocalPorts(doc)
	if err != nil {
		t.Fatal(err)
	}
	defer ports.close()
	held := ports.take(0, 0) // the prefill: an HTTP port and a KV side channel
	if held.http == 0 || held.kv == 0 {
		t.Fatalf("the prefill's ports: %+v", held)
	}
	for _, port := range []int{held.http, held.kv} {
		if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			ln.Close()
			t.Fatalf("port %d was free once taken for its worker: another process could bind it before the worker", port)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	kv, err := wiring.WorkerKVConfig(doc.Stages[0], topology.Replica{EngineID: "prefill-0", KVPort: held.kv})
	if err != nil {
		t.Fatal(err)
	}
	w, err := launch.Start(exe, launch.Spec{Name: "thinker-prefill-0", Listener: held.httpLn, KVListener: held.kvLn, KVTransferConfig: kv}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop(5 * time.Second)
	if want := fmt.Sprintf("http://127.0.0.1:%d", held.http); w.URL != want {
		t.Errorf("worker URL %s, want %s", w.URL, want)
	}
	if err := w.WaitHealthy(untilDeadline(t)); err != nil {
		t.Fatal(err)
	}
}

// stealer binds, the moment serve says it starts a prefill worker, the KV
// side channel the line names: what another process asking the kernel for
// a free port may be given once the port is free. (The decode, a
// kv_consumer, opens no side channel: the port picked for it is let go.)
type stealer struct {
	lockedBuffer
	mu     sync.Mutex
	tried  []string
	stolen []net.Listener
}

var kvChannel = regexp.MustCompile(`starting reference worker thinker-prefill-\d+ \(KV side channel (\S+),`)

func (s *stealer) Write(p []byte) (int, error) {
	if m := kvChannel.FindSubmatch(p); m != nil {
		s.mu.Lock()
		s.tried = append(s.tried, string(m[1]))
		if ln, err := net.Listen("tcp", string(m[1])); err == nil {
			s.stolen = append(s.stolen, ln)
		}
		s.mu.Unlock()
	}
	return s.lockedBuffer.Write(p)
}

// Another process that binds a prefill's KV side channel the moment serve
// starts that worker cannot: serve hands the worker the port it holds, and
// the worker serves its PD handoffs on it. (Its HTTP port, which no line
// names before the worker is ready, is held the same way:
// TestTakenPortsStayBound, and launch's TestWorkerServesOnTheListenersItIsGiven.)
func TestServeKeepsWorkerPortsFromOtherProcesses(t *testing.T) {
	t.Setenv(asOmnipd, "1")
	ctx := untilDeadline(t)
	out, errOut := &stealer{}, &lockedBuffer{}
	defer func() {
		for _, ln := range out.stolen {
			ln.Close()
		}
	}()
	serveCtx, stop := context.WithCancel(ctx)
	var code int
	served := make(chan struct{})
	go func() {
		defer close(served)
		code = Run(serveCtx, []string{"serve", "--port", "0", "--config", writeThinkerPDConfig(t)}, out, errOut)
	}()
	defer func() { stop(); <-served }() // serve stops its workers
	serving := regexp.MustCompile(`omnipd serving .* on (http://\S+)`)
	var url string
	for url == "" {
		select {
		case <-served:
			t.Fatalf("serve exited %d before serving:\n%s\n%s", code, out.String(), errOut.String())
		case <-ctx.Done():
			t.Fatalf("serve did not start:\n%s\n%s", out.String(), errOut.String())
		case <-time.After(20 * time.Millisecond):
		}
		if m := serving.FindStringSubmatch(out.String()); m != nil {
			url = m[1]
		}
	}
	out.mu.Lock()
	tried, stolen := out.tried, len(out.stolen)
	out.mu.Unlock()
	if len(tried) == 0 || stolen != 0 {
		t.Errorf("tried to bind the KV side channels %v, and bound %d of them", tried, stolen)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(`{"prompt":"Hello there","max_tokens":4}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Omnipd-Pd-Path") != "disaggregated" {
		t.Errorf("%d %s %s", resp.StatusCode, resp.Header.Get("X-Omnipd-Pd-Path"), body)
	}
	stop()
	<-served
	if code != 0 {
		t.Errorf("serve exited %d:\n%s", code, errOut.String())
	}
}
