package deploy_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/topology"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/expand")

const fixtures = "testdata/fixtures/vllm-omni/"

type goldenCase struct {
	name string
	file string
	opts deploy.Options
	json bool
}

func goldenCases() []goldenCase {
	cases := []goldenCase{
		{name: "embedded_default"},
		{name: "default", file: fixtures + "qwen3_omni_moe.yaml"},
		{name: "thinking", file: fixtures + "qwen3_omni_moe_thinking.yaml"},
		{name: "legacy", file: fixtures + "legacy_qwen3_omni_moe.yaml"},
		{name: "legacy_pd_separation", file: fixtures + "legacy_qwen3_omni_moe_pd_separation.yaml"},
		{name: "thinking_pd", file: fixtures + "qwen3_omni_moe_thinking.yaml", opts: deploy.Options{PD: true}},
		{name: "legacy_pd_nixl", file: fixtures + "legacy_qwen3_omni_moe.yaml", opts: deploy.Options{PD: true, Connector: "NixlConnector"}},
		{name: "default_npu", file: fixtures + "qwen3_omni_moe.yaml", opts: deploy.Options{Platform: "npu"}},
		{name: "default_npu_pd", file: fixtures + "qwen3_omni_moe.yaml", opts: deploy.Options{Platform: "npu", PD: true, Connector: "MooncakeConnector"}},
		{name: "default_pd_pool", file: fixtures + "qwen3_omni_moe.yaml", opts: deploy.Options{PD: true, Devices: "4-7"}},
		{name: "default_pd_json", file: fixtures + "qwen3_omni_moe.yaml", opts: deploy.Options{PD: true}, json: true},
		{name: "xpyd_nixl", file: "testdata/expand/xpyd_nixl.yaml"},
		{name: "dp_nixl", file: "testdata/expand/dp_nixl.yaml"},
		{name: "overlay_platform", file: "testdata/expand/overlay_platform.yaml", opts: deploy.Options{Platform: "rocm"}},
		{name: "handwritten_kv_role", file: "testdata/expand/handwritten_kv_role.yaml"},
		{name: "endpoints", file: "testdata/expand/endpoints.yaml"},
		{name: "lmcache_pd", file: "testdata/expand/lmcache_pd.yaml"},
		{name: "epd", file: "testdata/expand/epd.yaml"},
		{name: "epd_2e_mooncake", file: "testdata/expand/epd_2e_mooncake.yaml"},
		{name: "handwritten_epd", file: "testdata/expand/handwritten_epd.yaml"},
		{name: "epd_pinned_encoder", file: "testdata/expand/epd_pinned_encoder.yaml"},
	}
	for _, c := range deploy.KVConnectors() {
		cases = append(cases, goldenCase{
			name: "default_pd_" + strings.ToLower(strings.TrimSuffix(c, "Connector")),
			file: fixtures + "qwen3_omni_moe.yaml",
			opts: deploy.Options{PD: true, Connector: c},
		})
	}
	return cases
}

func render(t *testing.T, doc *deploy.Document, asJSON bool) []byte {
	t.Helper()
	var out []byte
	var err error
	if asJSON {
		out, err = doc.Node().MarshalJSON()
		if err == nil {
			var buf bytes.Buffer
			err = json.Indent(&buf, out, "", "  ")
			out = append(buf.Bytes(), '\n')
		}
	} else {
		out, err = doc.Node().MarshalYAML()
	}
	if err != nil {
		t.Fatalf("print: %v", err)
	}
	return out
}

// TestExpandGolden pins the resolved document of each input, and checks that
// the output loads back to itself and validates.
func TestExpandGolden(t *testing.T) {
	for _, c := range goldenCases() {
		t.Run(c.name, func(t *testing.T) {
			var doc *deploy.Document
			var err error
			if c.file == "" {
				doc, _, err = deploy.Load(deploy.DefaultConfigName, deploy.DefaultConfig(), c.opts)
			} else {
				doc, _, err = deploy.LoadFile(c.file, c.opts)
			}
			if err != nil {
				t.Fatalf("load %s: %v", c.file, err)
			}
			got := render(t, doc, c.json)
			ext := ".golden.yaml"
			if c.json {
				ext = ".golden.json"
			}
			golden := filepath.Join("testdata", "expand", c.name+ext)
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("read golden file (run go test ./deploy -run TestExpandGolden -update): %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("expand %s differs from %s (rerun with -update if intended):\n%s", c.file, golden, lineDiff(string(want), string(got)))
			}

			// Expanding an expanded document, with the same flags, changes
			// nothing. (The platform is already applied. JSON is YAML.)
			reopts := c.opts
			reopts.Platform = ""
			again, warnings, err := deploy.Load(golden, got, reopts)
			if err != nil {
				t.Fatalf("the expanded document does not load back: %v", err)
			}
			if len(warnings) > 0 {
				t.Errorf("the expanded document loads with warnings: %v", warnings)
			}
			if second := render(t, again, c.json); !bytes.Equal(second, got) {
				t.Errorf("expanding the expanded document changed it:\n%s", lineDiff(string(got), string(second)))
			}
			if v := topology.Validate(again.Topology()); len(v) > 0 {
				t.Errorf("the expanded document has violations: %v", v)
			}
		})
	}
}

// lineDiff shows the first lines where two texts differ.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	shown := 0
	for i := 0; i < max(len(w), len(g)) && shown < 12; i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			shown++
			fmt.Fprintf(&b, "line %d:\n  want: %s\n  got:  %s\n", i+1, wl, gl)
		}
	}
	return b.String()
}
