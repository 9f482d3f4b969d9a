package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/internal/buildinfo"
)

const fixtures = "../../deploy/testdata/fixtures/vllm-omni/"

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestValidateSummarisesTopology(t *testing.T) {
	code, out, errOut := run(t, "validate", "--pd", "--connector", "MooncakeConnector", fixtures+"qwen3_omni_moe.yaml")
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	for _, want := range []string{
		"4 stages, prefill/decode disaggregated over MooncakeConnector",
		"[0] thinker prefill", "[1] thinker decode", "[2] talker", "[3] code2wav", "-> audio",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "\n"); n > 24 {
		t.Errorf("summary is %d lines; it should fit one screen", n)
	}
}

func TestValidateReportsEveryErrorWithPosition(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "bad.yaml")
	err := os.WriteFile(cfg, []byte(`stages:
  - stage_id: 0
    is_prefill_only: true
    devices: "0"
    kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_consumer}
  - stage_id: 1
    is_decode_only: true
    devices: "0"
    kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_consumer}
  - stage_id: 2
    num_replicas: zero
  - stage_id: 3
`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "validate", cfg)
	if code != 1 {
		t.Fatalf("exit %d, want 1; stdout:\n%s", code, out)
	}
	if out != "" {
		t.Errorf("nothing belongs on stdout when validation fails, got:\n%s", out)
	}
	lines := regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(cfg)+`:\d+:\d+: stages\[\d\]\.\S+: .+$`).FindAllString(errOut, -1)
	if len(lines) != 3 {
		t.Errorf("want 3 positioned errors (prefill kv_role, shared device, num_replicas), got %d:\n%s", len(lines), errOut)
	}
	if !strings.Contains(errOut, "3 error(s)") {
		t.Errorf("stderr lacks the error count:\n%s", errOut)
	}
}

func TestExpandEmbeddedDefaultLoadsBack(t *testing.T) {
	code, out, errOut := run(t, "expand")
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	doc, _, err := deploy.Load("expanded.yaml", []byte(out), deploy.Options{})
	if err != nil {
		t.Fatalf("expand output does not load: %v\n%s", err, out)
	}
	if doc.PD == nil || len(doc.Stages) != 4 {
		t.Errorf("the embedded default should be a 4-stage PD topology, got %d stages, PD %+v", len(doc.Stages), doc.PD)
	}
}

func TestExpandJSON(t *testing.T) {
	code, out, errOut := run(t, "expand", "-o", "json", "--pd", fixtures+"qwen3_omni_moe_thinking.yaml")
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	var doc struct {
		Stages []struct {
			StageID  int    `json:"stage_id"`
			Devices  string `json:"devices"`
			Prefill  bool   `json:"is_prefill_only"`
			KVConfig struct {
				Role string `json:"kv_role"`
			} `json:"kv_transfer_config"`
		} `json:"stages"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(doc.Stages) != 2 || !doc.Stages[0].Prefill || doc.Stages[0].Devices != "0,1" || doc.Stages[1].Devices != "2,3" {
		t.Errorf("thinker-only TP=2 PD should give prefill on 0,1 and decode on 2,3; got %+v", doc.Stages)
	}
}

func TestExpandMigrate(t *testing.T) {
	code, out, errOut := run(t, "expand", "--migrate", fixtures+"legacy_qwen3_omni_moe.yaml")
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	if !strings.Contains(errOut, "legacy stage_args") {
		t.Errorf("stderr lacks the migration warning:\n%s", errOut)
	}
	if !strings.Contains(out, "stages:") || strings.Contains(out, "stage_args") {
		t.Errorf("migrated document is not in the stages: schema:\n%s", out)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"expand", "--migrate"},
		{"expand", "-o", "xml"},
		{"validate", "a.yaml", "b.yaml"},
		{"expand", "--platform"},
		{"no-such-command"},
	} {
		code, _, errOut := run(t, args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2 (usage error)", args, code)
		}
		if !strings.HasPrefix(errOut, "omnipd: ") {
			t.Errorf("%v: stderr should say what is wrong, got %q", args, errOut)
		}
	}
	code, _, errOut := run(t, "validate", "no/such/file.yaml")
	if code != 1 || !strings.Contains(errOut, "no such file") {
		t.Errorf("missing file: exit %d, stderr %q", code, errOut)
	}
}

// "omnipd version", "omnipd --version" (as vllm --version) and -v all
// print the build's one line: version, revision, toolchain.
func TestVersion(t *testing.T) {
	want := buildinfo.Read().String() + "\n"
	for _, args := range [][]string{{"version"}, {"--version"}, {"-v"}} {
		code, out, errOut := run(t, args...)
		if code != 0 || out != want {
			t.Errorf("omnipd %s: exit %d, stdout %q, stderr %q; want %q", strings.Join(args, " "), code, out, errOut, want)
		}
	}
}

func TestDebugAddrServesTheProfiler(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stderr bytes.Buffer
	if code := Run(ctx, []string{"--debug-addr", addr, "version"}, io.Discard, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	resp, err := http.Get("http://" + addr + "/debug/pprof/cmdline")
	if err != nil {
		t.Fatalf("profiler not served: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/debug/pprof/cmdline: %s", resp.Status)
	}
}

func TestChildDebugAddr(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:6060": "127.0.0.1:0",
		"[::1]:6060":     "[::1]:0",
		"localhost:1":    "localhost:0",
		"bad":            "127.0.0.1:0",
	} {
		if got := childDebugAddr(addr); got != want {
			t.Errorf("childDebugAddr(%q) = %q, want %q", addr, got, want)
		}
	}
}

// validate says which edges stream: with async_chunk the Thinker's rows
// reach the Talker as the decode makes them (under PD the prompt's rows
// from the prefill), and the codec frames reach Code2Wav in chunks;
// without it the Talker waits for the whole answer.
func TestValidateSaysWhichEdgesStream(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		async bool
		pd    bool
		extra string // appended to the config
		want  []string
	}{
		// A stage's own async_chunk: false (an engine argument of each
		// stage in vllm-omni) turns the edge it ends back to the batch
		// hand-off.
		{async: true, pd: true, extra: "stages:\n  - stage_id: 1\n    async_chunk: false\n", want: []string{
			"waits: [0],[1] -> [2] conditioning once the Thinker has finished (a stage sets async_chunk: false)"}},
		{async: true, pd: true, want: []string{
			"streams: [0],[1] -> [2] conditioning rows as the decode makes them",
			"streams: [2] -> [3] codec frames in chunks of 4, then 25 (left context 25)"}},
		{async: true, pd: false, want: []string{
			"streams: [0] -> [1] conditioning rows as the Thinker makes them"}},
		{async: false, pd: true, want: []string{
			"waits: [0],[1] -> [2] conditioning once the Thinker has finished (async_chunk: false)"}},
	} {
		cfg := filepath.Join(dir, fmt.Sprintf("async-%v-%d.yaml", tt.async, len(tt.extra)))
		text := fmt.Sprintf("base_config: %s\nasync_chunk: %v\n%s", mustAbs(t, fixtures+"qwen3_omni_moe.yaml"), tt.async, tt.extra)
		if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		args := []string{"validate", cfg}
		if tt.pd {
			args = []string{"validate", "--pd", cfg}
		}
		code, out, errOut := run(t, args...)
		if code != 0 {
			t.Fatalf("exit %d, stderr:\n%s", code, errOut)
		}
		for _, want := range tt.want {
			if !strings.Contains(out, want) {
				t.Errorf("async_chunk %v, pd %v: summary lacks %q:\n%s", tt.async, tt.pd, want, out)
			}
		}
	}
}

func mustAbs(t *testing.T, path string) string {
	t.Helper()
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}
