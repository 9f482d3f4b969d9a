package simulate

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

const us, ms = time.Microsecond, time.Millisecond

func TestStepTime(t *testing.T) {
	p := &Profile{
		Prefill: Linear{Base: 5 * ms, PerUnit: 27 * us},
		Decode:  Linear{Base: 4 * ms, PerUnit: 400 * us},
	}
	for _, c := range []struct {
		name            string
		prefill, decode int
		want            time.Duration
	}{
		{"empty step", 0, 0, 0},
		{"one-token prefill", 1, 0, 5*ms + 27*us},
		{"prefill chunk", 2048, 0, 5*ms + 2048*27*us},
		{"one decode", 0, 1, 4*ms + 400*us},
		{"decode batch", 0, 32, 4*ms + 32*400*us},
		// A mixed step pays both parts: one forward over the concatenated
		// tokens, nothing overlapped.
		{"mixed step sums", 1000, 16, 5*ms + 1000*27*us + 4*ms + 16*400*us},
		{"negative counts are empty", -3, -1, 0},
	} {
		if got := p.StepTime(c.prefill, c.decode); got != c.want {
			t.Errorf("%s: StepTime(%d, %d) = %v, want %v", c.name, c.prefill, c.decode, got, c.want)
		}
	}
	huge := &Profile{Prefill: Linear{Base: time.Hour, PerUnit: time.Hour}}
	if got := huge.StepTime(math.MaxInt, 0); got != math.MaxInt64 {
		t.Errorf("overflowing step = %v, want saturation at MaxInt64", got)
	}
}

func TestTransferTime(t *testing.T) {
	model := KVModel{Layers: 48, KVHeads: 4, HeadDim: 128, DTypeBytes: 2}
	if got := model.BytesPerToken(); got != 98304 {
		t.Fatalf("Qwen3-Omni Thinker bytes/token = %d, want 2·48·4·128·2 = 98304", got)
	}
	for _, c := range []struct {
		name   string
		kv     KVTransfer
		model  KVModel
		tokens int
		want   time.Duration
	}{
		{"setup only without a bandwidth", KVTransfer{Setup: ms}, model, 1000, ms},
		{"no tokens, no transfer", KVTransfer{Setup: ms, BytesPerSecond: 1e9}, model, 0, 0},
		// 1000 tokens x 1000 B at 1 MB/s = 1 s.
		{"bytes over bandwidth", KVTransfer{Setup: 2 * ms, BytesPerSecond: 1e6}, KVModel{1, 1, 500, 1}, 1000, 2*ms + time.Second},
		// 2500 x 98304 B = 245.76 MB at 23.75 GB/s = 10.347789473.. ms, rounded up.
		{"calibrated prompt", KVTransfer{Setup: ms, BytesPerSecond: 23.75e9}, model, 2500, ms + 10347790*time.Nanosecond},
		// 3 B at 2 B/s = 1.5 s exactly; 1 B at 3 B/s rounds up to 333333334 ns.
		{"exact half", KVTransfer{BytesPerSecond: 2}, KVModel{1, 1, 3, 1}, 1, 3 * time.Second},
		{"rounds up", KVTransfer{BytesPerSecond: 3}, KVModel{1, 1, 1, 1}, 1, 666666667 * time.Nanosecond},
	} {
		p := &Profile{KV: c.kv, Model: c.model}
		if got := p.TransferTime(c.tokens); got != c.want {
			t.Errorf("%s: TransferTime(%d) = %v (%d ns), want %v", c.name, c.tokens, got, got, c.want)
		}
	}
}

func TestIsZero(t *testing.T) {
	if !(&Profile{}).IsZero() || !(&Profile{MaxNumSeqs: 8, Name: "x"}).IsZero() {
		t.Error("a profile without costs is not zero")
	}
	for _, p := range []*Profile{
		{Prefill: Linear{PerUnit: 1}},
		{Decode: Linear{Base: 1}},
		{KV: KVTransfer{Setup: 1}},
		{KV: KVTransfer{BytesPerSecond: 1}, Model: KVModel{1, 1, 1, 1}},
		{Encoder: Encoder{Video: EncoderCost{PerToken: 1}}},
	} {
		if p.IsZero() {
			t.Errorf("%+v is zero", p)
		}
	}
}

func TestBuiltinsParse(t *testing.T) {
	names := Builtins()
	if !slices.Contains(names, "zero") || !slices.Contains(names, "h100-qwen3-omni-30b-a3b") {
		t.Fatalf("built-in profiles %v", names)
	}
	for _, n := range names {
		p, err := Load(n)
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		if p.Name != n {
			t.Errorf("built-in %s calls itself %q", n, p.Name)
		}
		if p.Description == "" {
			t.Errorf("%s has no description", n)
		}
	}
	zero, _ := Load("zero")
	if !zero.IsZero() {
		t.Errorf("zero costs something: %+v", zero)
	}
	// The calibrated profile reproduces the measurement it was fitted to:
	// one 2500-token prompt's first token after 72.77 ms (within rounding),
	// and the Thinker's 96 KiB a token.
	h, _ := Load("h100-qwen3-omni-30b-a3b")
	if got := h.StepTime(2500, 0); got < 72*ms || got > 73*ms {
		t.Errorf("calibrated 2500-token prefill = %v, want ~72.77ms", got)
	}
	if got := h.Model.BytesPerToken(); got != 96<<10 {
		t.Errorf("calibrated KV bytes/token = %d, want 96 KiB", got)
	}
	if h.MaxNumSeqs != 1024 || h.MaxNumBatchedTokens != 8192 {
		t.Errorf("calibrated limits %d/%d, want vLLM's H100 defaults 1024/8192", h.MaxNumSeqs, h.MaxNumBatchedTokens)
	}
}

func TestParseFull(t *testing.T) {
	src := `# comment
name: lab
description: a test profile
prefill: {base: 5ms, per_token: 27.5us}
decode:
  base: 4ms
  per_sequence: 400µs
kv_transfer:
  setup: 1.5ms
  bandwidth: 200Gbit/s
model: {layers: 2, kv_heads: 2, head_dim: 8, kv_dtype: fp8}
limits: {max_num_seqs: 16, max_num_batched_tokens: 512}
`
	p, err := Parse("lab.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := Profile{
		Name: "lab", Description: "a test profile",
		Prefill: Linear{5 * ms, 27500 * time.Nanosecond}, Decode: Linear{4 * ms, 400 * us},
		KV:         KVTransfer{Setup: 1500 * us, BytesPerSecond: 25e9},
		Model:      KVModel{Layers: 2, KVHeads: 2, HeadDim: 8, DTypeBytes: 1},
		MaxNumSeqs: 16, MaxNumBatchedTokens: 512,
	}
	if *p != want {
		t.Errorf("parsed\n%+v\nwant\n%+v", *p, want)
	}
	// Without name: the file's base name names it.
	p, err = Parse("/etc/omnipd/rack7.yaml", []byte("decode: {base: 1ms}\n"))
	if err != nil || p.Name != "rack7" {
		t.Errorf("unnamed profile: %+v, %v", p, err)
	}
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct {
		name, src string
		// want are substrings of the error, the first being its position.
		want []string
	}{
		{"unknown top-level field", "name: x\nprefil:\n  base: 5ms\n", []string{"p.yaml:2:1: prefil: unknown field; want name, description, prefill"}},
		{"unknown nested field", "prefill:\n  base: 5ms\n  per_tok: 3us\n", []string{"p.yaml:3:3: prefill.per_tok: unknown field; want base or per_token"}},
		{"duration without unit", "decode:\n  base: 5\n", []string{"p.yaml:2:9: decode.base:", `"5" has no unit`}},
		{"unknown duration unit", "decode:\n  per_sequence: 5sec\n", []string{"p.yaml:2:17: decode.per_sequence:", `"5sec" is not a duration`}},
		{"negative duration", "prefill: {base: -1ms}\n", []string{"p.yaml:1:17: prefill.base:", "negative"}},
		{"unit slip", "prefill: {per_token: 27h}\n", []string{"p.yaml:1:22: prefill.per_token:", "more than an hour"}},
		{"bandwidth without unit", "kv_transfer: {bandwidth: 25}\nmodel: {layers: 1, kv_heads: 1, head_dim: 1, kv_dtype: bf16}\n", []string{"p.yaml:1:26: kv_transfer.bandwidth:", "has no unit"}},
		{"bandwidth unknown unit", "kv_transfer:\n  bandwidth: 25GB\n", []string{"p.yaml:2:14: kv_transfer.bandwidth:", `unknown unit "GB"`}},
		{"zero bandwidth", "kv_transfer:\n  bandwidth: 0GB/s\n", []string{"p.yaml:2:14: kv_transfer.bandwidth:", "must be positive"}},
		{"bandwidth without model", "kv_transfer:\n  bandwidth: 25GB/s\n", []string{"p.yaml:2:14: kv_transfer.bandwidth:", "needs model:"}},
		{"incomplete model", "model:\n  layers: 4\n  kv_heads: 2\n", []string{"p.yaml:2:3: model:", "missing head_dim, kv_dtype"}},
		{"unknown dtype", "model: {layers: 1, kv_heads: 1, head_dim: 1, kv_dtype: int3}\n", []string{"p.yaml:1:56: model.kv_dtype:", `unknown dtype "int3"`}},
		{"count not a number", "limits:\n  max_num_seqs: many\n", []string{"p.yaml:2:17: limits.max_num_seqs:", "not a whole number"}},
		{"negative limit", "limits:\n  max_num_batched_tokens: -1\n", []string{"p.yaml:2:27: limits.max_num_batched_tokens:", "less than 0"}},
		{"section not a mapping", "prefill: 5ms\n", []string{"p.yaml:1:10: prefill: want a mapping of base or per_token"}},
		{"value not a scalar", "decode:\n  base: [1ms]\n", []string{"p.yaml:2:9: decode.base: want a single value"}},
		{"missing value", "decode:\n  base:\n", []string{"p.yaml:2:8: decode.base: missing value"}},
		{"duplicate key", "decode: {base: 1ms}\ndecode: {base: 2ms}\n", []string{"p.yaml:2:1: decode: given twice (first at line 1)"}},
		{"syntax error", "decode: {base: 1ms\n", []string{"p.yaml:", "invalid YAML"}},
		{"empty file", "# nothing\n", []string{"p.yaml:1:1: the profile is empty"}},
		{"not a mapping", "- 1\n", []string{"p.yaml:1:1: want a mapping"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := Parse("p.yaml", []byte(c.src))
			if err == nil {
				t.Fatalf("parsed %+v", p)
			}
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("error %v is not Errors", err)
			}
			if !strings.HasPrefix(err.Error(), c.want[0]) {
				t.Errorf("error\n  %v\nwant it to start with\n  %s", err, c.want[0])
			}
			for _, w := range c.want[1:] {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// Every error is reported, not just the first.
func TestParseReportsEveryError(t *testing.T) {
	_, err := Parse("p.yaml", []byte("prefill: {base: 5}\ndecode: {per_sequence: 1parsec}\nbogus: 1\n"))
	var es Errors
	if !errors.As(err, &es) || len(es) != 3 {
		t.Fatalf("want 3 errors, got %v", err)
	}
	for i, line := range []int{1, 2, 3} {
		if es[i].Line != line {
			t.Errorf("error %d at line %d, want %d: %v", i, es[i].Line, line, es[i])
		}
	}
}

func TestParseUnits(t *testing.T) {
	for s, want := range map[string]time.Duration{"0": 0, "0s": 0, "27us": 27 * us, "27µs": 27 * us, "1.5ms": 1500 * us, "2s": 2 * time.Second, "100ns": 100} {
		if got, err := ParseDuration(s); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for s, want := range map[string]float64{"25GB/s": 25e9, "400Gbit/s": 50e9, "400Gbps": 50e9, "1GiB/s": 1 << 30, "23.75 GB/s": 23.75e9, "100MB/s": 1e8, "8bit/s": 1} {
		if got, err := ParseBandwidth(s); err != nil || got != want {
			t.Errorf("ParseBandwidth(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "GB/s", "-1GB/s", "1e9B/s", "1..2GB/s", "25 gb/s"} {
		if _, err := ParseBandwidth(s); err == nil {
			t.Errorf("ParseBandwidth(%q) accepted", s)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mine.yaml")
	if err := os.WriteFile(path, []byte("decode: {base: 3ms}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil || p.Name != "mine" || p.Decode.Base != 3*ms {
		t.Fatalf("Load(%s) = %+v, %v", path, p, err)
	}
	if _, err := Load(filepath.Join(dir, "absent.yaml")); err == nil || !strings.Contains(err.Error(), "zero") {
		t.Errorf("a missing file: %v (want the error to list the built-ins)", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	_ = os.WriteFile(bad, []byte("decode: {base: 3}\n"), 0o600)
	if _, err := Load(bad); err == nil || !strings.HasPrefix(err.Error(), bad+":1:") {
		t.Errorf("a bad file: %v (want its path and line first)", err)
	}
	if _, ok := Builtin("../profiles/zero"); ok {
		t.Error("a built-in name may not be a path")
	}
}
