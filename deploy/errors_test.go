package deploy_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/topology"
)

// The configs here and in the case tables of errors_topology_test.go and
// errors_loader_test.go are written the way users write them. In every
// inline config, line 1 is the line right after the opening backtick (inline
// drops that first newline), and columns count from 1, so a position can be
// checked by eye: in
//
//	    devices: "0"
//
// the key is at column 5 and the value at column 14.

// inline turns an inline config into the bytes a user would have in deploy.yaml.
func inline(cfg string) []byte { return []byte(strings.TrimPrefix(cfg, "\n")) }

// numberLines prints a config with line numbers, for failure messages.
func numberLines(cfg string) string {
	var b strings.Builder
	for i, line := range strings.Split(strings.TrimPrefix(cfg, "\n"), "\n") {
		fmt.Fprintf(&b, "%3d| %s\n", i+1, line)
	}
	return b.String()
}

// memFS serves base_config files from memory; any other name does not exist.
func memFS(files map[string]string) func(string) ([]byte, error) {
	return func(name string) ([]byte, error) {
		if data, ok := files[name]; ok {
			return inline(data), nil
		}
		return nil, &os.PathError{Op: "open", Path: name, Err: os.ErrNotExist}
	}
}

// loadInline loads cfg as deploy.yaml and returns the errors it reports.
func loadInline(t *testing.T, cfg string, opts deploy.Options) (*deploy.Document, []deploy.Warning, deploy.Errors) {
	t.Helper()
	if opts.ReadFile == nil {
		opts.ReadFile = memFS(nil)
	}
	doc, warnings, err := deploy.Load("deploy.yaml", inline(cfg), opts)
	if err == nil {
		if doc == nil {
			t.Fatal("Load returned neither a document nor an error")
		}
		return doc, warnings, nil
	}
	var es deploy.Errors
	if !errors.As(err, &es) {
		t.Fatalf("Load error is %T, want deploy.Errors: %v", err, err)
	}
	if doc != nil {
		t.Errorf("Load returned a document together with errors")
	}
	if len(es) == 0 {
		t.Fatalf("Load returned an empty deploy.Errors")
	}
	return nil, warnings, es
}

// validPDConfig is the basic TP=1 disaggregated Qwen3-Omni layout (the legacy PD
// fixture in the stages: schema): prefill on device 0, decode on 1, Talker
// and Code2Wav sharing 2, Mooncake between prefill and decode.
const validPDConfig = `
async_chunk: false
connectors:
  shm:
    name: SharedMemoryConnector
stages:
  - stage_id: 0
    model_stage: thinker
    is_prefill_only: true
    devices: "0"
    tensor_parallel_size: 1
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
      kv_connector_extra_config:
        mooncake_bootstrap_port: 25201
  - stage_id: 1
    model_stage: thinker
    is_decode_only: true
    devices: "1"
    tensor_parallel_size: 1
    input_sources: [0]
    final_output: true
    final_output_type: text
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
      kv_connector_extra_config:
        mooncake_bootstrap_port: 25202
  - stage_id: 2
    model_stage: talker
    devices: "2"
    input_sources: [1]
    input_connectors:
      from_stage_1: shm
  - stage_id: 3
    model_stage: code2wav
    devices: "2"
    input_sources: [2]
    default_sampling_params:
      temperature: 0.0
`

// valid3Config is the colocated three-stage pipeline, stages matched by id.
const valid3Config = `
stages:
  - stage_id: 0
    devices: "0"
  - stage_id: 1
    devices: "1"
  - stage_id: 2
    devices: "1"
`

func TestLoadValidConfigs(t *testing.T) {
	t.Run("pd", func(t *testing.T) {
		doc, warnings, errs := loadInline(t, validPDConfig, deploy.Options{})
		if errs != nil || len(warnings) > 0 {
			t.Fatalf("errors %v, warnings %v", errs, warnings)
		}
		wantStages(t, doc, []stageWant{
			{0, "thinker", topology.RolePrefill, nil, "0", "MooncakeConnector", "kv_producer"},
			{1, "thinker", topology.RoleDecode, []int{0}, "1", "MooncakeConnector", "kv_consumer"},
			{2, "talker", topology.RoleFull, []int{1}, "2", "", ""},
			{3, "code2wav", topology.RoleFull, []int{2}, "2", "", ""},
		})
		if doc.PD == nil || doc.PD.Connector != "MooncakeConnector" {
			t.Errorf("PD = %+v, want MooncakeConnector", doc.PD)
		}
		if got := doc.Stages[0].Replicas[0].KVPort; got != 25201 {
			t.Errorf("prefill kv port %d, want the bootstrap port 25201", got)
		}
	})
	t.Run("pd requested again with the same connector", func(t *testing.T) {
		doc, _, errs := loadInline(t, validPDConfig, deploy.Options{PD: true, Connector: "MooncakeConnector"})
		if errs != nil {
			t.Fatal(errs)
		}
		if len(doc.Stages) != 4 {
			t.Errorf("%d stages, want the 4 already there", len(doc.Stages))
		}
	})
	t.Run("three stages", func(t *testing.T) {
		doc, warnings, errs := loadInline(t, valid3Config, deploy.Options{})
		if errs != nil || len(warnings) > 0 {
			t.Fatalf("errors %v, warnings %v", errs, warnings)
		}
		wantStages(t, doc, []stageWant{
			{0, "thinker", topology.RoleFull, nil, "0", "", ""},
			{1, "talker", topology.RoleFull, []int{0}, "1", "", ""},
			{2, "code2wav", topology.RoleFull, []int{1}, "1", "", ""},
		})
		if doc.PD != nil {
			t.Errorf("PD = %+v, want nil", doc.PD)
		}
	})
	t.Run("three stages expanded with --pd", func(t *testing.T) {
		doc, _, errs := loadInline(t, valid3Config, deploy.Options{PD: true, Connector: "MooncakeConnector"})
		if errs != nil {
			t.Fatal(errs)
		}
		wantStages(t, doc, []stageWant{
			{0, "thinker", topology.RolePrefill, nil, "0", "MooncakeConnector", "kv_producer"},
			{1, "thinker", topology.RoleDecode, []int{0}, "1", "MooncakeConnector", "kv_consumer"},
			{2, "talker", topology.RoleFull, []int{1}, "2", "", ""},
			{3, "code2wav", topology.RoleFull, []int{2}, "2", "", ""},
		})
	})
}

type stageWant struct {
	id      int
	model   string
	role    topology.Role
	inputs  []int
	devices string
	kvConn  string
	kvRole  string
}

func wantStages(t *testing.T, doc *deploy.Document, want []stageWant) {
	t.Helper()
	if len(doc.Stages) != len(want) {
		t.Fatalf("%d stages, want %d:\n%s", len(doc.Stages), len(want), doc.Summary())
	}
	for i, w := range want {
		s := doc.Stages[i]
		var kvConn, kvRole string
		if s.KV != nil {
			kvConn, kvRole = s.KV.Connector, s.KV.Role
		}
		if s.ID != w.id || s.ModelStage != w.model || s.Role != w.role || !slices.Equal(s.InputSources, w.inputs) && len(s.InputSources)+len(w.inputs) > 0 ||
			topology.FormatDevices(s.Devices) != w.devices || kvConn != w.kvConn || kvRole != w.kvRole {
			t.Errorf("stages[%d] = {%d %s %s inputs %v devices %q kv %q %q}, want %+v",
				i, s.ID, s.ModelStage, s.Role, s.InputSources, topology.FormatDevices(s.Devices), kvConn, kvRole, w)
		}
	}
}

// errorCase is a config with exactly one mistake and the one error it must
// produce.
type errorCase struct {
	name string
	cfg  string
	opts deploy.Options
	// files are base_config files, by the name Options.ReadFile is asked for.
	files map[string]string

	// file is the file of the error's position; deploy.yaml when empty.
	file string
	// line and col are the expected position; 0, 0 for command-line flags,
	// which have no place in a file.
	line, col int
	path      string
	// code is the topology violation code; empty for the loader's own errors.
	code string
	// msg is a fragment the message must contain.
	msg string
}

func TestLoadErrors(t *testing.T) {
	for _, group := range []struct {
		name  string
		cases []errorCase
	}{{"topology", topologyCases}, {"loader", loaderCases}} {
		t.Run(group.name, func(t *testing.T) {
			for _, c := range group.cases {
				t.Run(c.name, func(t *testing.T) {
					checkOneError(t, c)
				})
			}
		})
	}
}

func checkOneError(t *testing.T, c errorCase) {
	t.Helper()
	opts := c.opts
	opts.ReadFile = memFS(c.files)
	_, _, errs := loadInline(t, c.cfg, opts)
	if len(errs) != 1 {
		t.Fatalf("got %d errors, want exactly one:\n%v\nconfig:\n%s", len(errs), errs, numberLines(c.cfg))
	}
	e := errs[0]
	want := deploy.Pos{}
	if c.line != 0 {
		want = deploy.Pos{File: "deploy.yaml", Line: c.line, Col: c.col}
		if c.file != "" {
			want.File = c.file
		}
	}
	if e.Pos != want {
		t.Errorf("position %s, want %s\nconfig:\n%s", e.Pos, want, numberLines(c.cfg))
	}
	if e.Path != c.path {
		t.Errorf("path %q, want %q", e.Path, c.path)
	}
	if e.Code != c.code {
		t.Errorf("code %q, want %q", e.Code, c.code)
	}
	if !strings.Contains(e.Msg, c.msg) {
		t.Errorf("message %q does not contain %q", e.Msg, c.msg)
	}
	if t.Failed() {
		t.Logf("error: %v", e)
	}
}

// TestViolationCodesCovered walks the codes declared in topology/validate.go
// so that a new code cannot be added without a config that reaches it (or a
// reason why none can).
func TestViolationCodesCovered(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "../topology/validate.go", nil, 0)
	if err != nil {
		t.Fatalf("read the violation codes: %v", err)
	}
	var codes []string
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Code") || i >= len(vs.Values) {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					code, _ := strconv.Unquote(lit.Value)
					codes = append(codes, code)
				}
			}
		}
	}
	if len(codes) < 40 {
		t.Fatalf("found only %d codes in validate.go; has the file moved?", len(codes))
	}
	reached := map[string]bool{}
	for _, c := range slices.Concat(topologyCases, encoderTopologyCases) {
		reached[c.code] = true
	}
	loaderNames := map[string]bool{}
	for _, c := range slices.Concat(loaderCases, encoderLoaderCases) {
		loaderNames[c.name] = true
	}
	for _, code := range codes {
		u, unreachable := unreachableCodes[code]
		switch {
		case reached[code] && unreachable:
			t.Errorf("%s is reached by a case but listed as unreachable", code)
		case !reached[code] && !unreachable:
			t.Errorf("%s has no case that reaches it and no reason why it cannot be reached", code)
		case unreachable && !loaderNames[u.loaderCase]:
			t.Errorf("%s: loader case %q does not exist", code, u.loaderCase)
		}
	}
	for code := range reached {
		if !slices.Contains(codes, code) {
			t.Errorf("a case expects code %q, which validate.go does not declare", code)
		}
	}
}

// Each copy of the Thinker that has no role is its own mistake, so each is
// reported, and nothing else is.
func TestLoadThinkerTwiceWithoutRoles(t *testing.T) {
	const cfg = `
stages:
  - stage_id: 0
    model_stage: thinker
  - stage_id: 1
    model_stage: thinker
  - stage_id: 2
  - stage_id: 3
`
	_, _, errs := loadInline(t, cfg, deploy.Options{})
	want := []string{
		"deploy.yaml:2:5: stages[0]: the Thinker appears 2 times",
		"deploy.yaml:4:5: stages[1]: the Thinker appears 2 times",
	}
	if len(errs) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%v", len(errs), len(want), errs)
	}
	for i, e := range errs {
		if !strings.HasPrefix(e.Error(), want[i]) {
			t.Errorf("error %d = %q, want prefix %q", i, e, want[i])
		}
	}
}

// multiMistake has five unrelated mistakes: a PD role error, overlapping
// prefill/decode devices, an input source that names no stage, an
// undefined stage connector and a type error. One Load must report them all,
// in file order.
const multiMistake = `
connectors:
  shm:
    name: SharedMemoryConnector
stages:
  - stage_id: 0
    is_prefill_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
  - stage_id: 1
    is_decode_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
  - stage_id: 2
    devices: "1"
    input_sources: [9]
  - stage_id: 3
    devices: "1"
    tensor_parallel_size: two
    input_connectors:
      from_stage_2: shn
`

func TestLoadReportsEveryMistake(t *testing.T) {
	_, _, errs := loadInline(t, multiMistake, deploy.Options{})
	want := []struct {
		line, col  int
		path, code string
	}{
		{10, 16, "stages[0].kv_transfer_config.kv_role", topology.CodePDPrefillKVRole},
		{13, 14, "stages[1].devices", topology.CodePDDevicesOverlap},
		{19, 21, "stages[2].input_sources[0]", topology.CodeInputSourceUnknown},
		{22, 27, "stages[3].tensor_parallel_size", ""},
		{24, 21, "stages[3].input_connectors.from_stage_2", topology.CodeConnectorUndefined},
	}
	if len(errs) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%v\nconfig:\n%s", len(errs), len(want), errs, numberLines(multiMistake))
	}
	for i, w := range want {
		e := errs[i]
		if e.Pos != (deploy.Pos{File: "deploy.yaml", Line: w.line, Col: w.col}) || e.Path != w.path || e.Code != w.code {
			t.Errorf("error %d = %v [%s], want %d:%d %s [%s]", i, e, e.Code, w.line, w.col, w.path, w.code)
		}
	}
	if !slices.IsSortedFunc(errs, func(a, b deploy.Error) int {
		if a.Pos.Line != b.Pos.Line {
			return a.Pos.Line - b.Pos.Line
		}
		return a.Pos.Col - b.Pos.Col
	}) {
		t.Errorf("errors are not sorted by position:\n%v", errs)
	}
}

func TestLoadWarnings(t *testing.T) {
	t.Run("legacy stage_args migrated", func(t *testing.T) {
		const cfg = `
async_chunk: false
stage_args:
  - stage_id: 0
    runtime:
      devices: "0"
    engine_args:
      model_stage: thinker
  - stage_id: 1
    runtime:
      devices: "1"
  - stage_id: 2
    runtime:
      devices: "1"
`
		doc, warnings, errs := loadInline(t, cfg, deploy.Options{})
		if errs != nil {
			t.Fatal(errs)
		}
		if len(doc.Stages) != 3 {
			t.Errorf("%d stages, want 3", len(doc.Stages))
		}
		if len(warnings) != 1 {
			t.Fatalf("got %d warnings, want 1: %v", len(warnings), warnings)
		}
		w := warnings[0]
		if w.Pos != (deploy.Pos{File: "deploy.yaml", Line: 2, Col: 1}) || w.Path != "stage_args" ||
			!strings.Contains(w.Msg, "legacy stage_args: schema was removed") {
			t.Errorf("warning = %s", w)
		}
	})
	t.Run("near-miss stage key", func(t *testing.T) {
		const cfg = `
stages:
  - stage_id: 0
    devices: "0"
    tensor_paralel_size: 1
  - stage_id: 1
  - stage_id: 2
`
		doc, warnings, errs := loadInline(t, cfg, deploy.Options{})
		if errs != nil {
			t.Fatal(errs)
		}
		if len(warnings) != 1 {
			t.Fatalf("got %d warnings, want 1: %v", len(warnings), warnings)
		}
		want := `warning: deploy.yaml:4:5: stages[0].tensor_paralel_size: unknown key "tensor_paralel_size" is passed to the engine as an argument; did you mean "tensor_parallel_size"?`
		if got := warnings[0].String(); got != want {
			t.Errorf("warning\n got %s\nwant %s", got, want)
		}
		// Unknown stage keys are engine arguments, passed on as written.
		if doc.Stages[0].EngineArgs.Get("tensor_paralel_size") == nil {
			t.Errorf("tensor_paralel_size was not kept as an engine argument")
		}
	})
}

var errorLine = regexp.MustCompile(`^deploy\.yaml:\d+:\d+: stages\[\d+\][a-z_.\[\]0-9]*: \S.*$`)

func TestErrorStrings(t *testing.T) {
	// The form STYLE.md gives: file:line:col: path: message.
	var decode errorCase
	for _, c := range topologyCases {
		if c.code == topology.CodePDDecodeKVRole {
			decode = c
		}
	}
	_, _, errs := loadInline(t, decode.cfg, deploy.Options{})
	want := `deploy.yaml:16:16: stages[1].kv_transfer_config.kv_role: "kv_producer" on a decode stage; want kv_consumer or kv_both`
	if errs.Error() != want {
		t.Errorf("Error()\n got %s\nwant %s", errs.Error(), want)
	}

	// Several errors: one line each, in the same form, and each reachable
	// with errors.As.
	doc, _, err := deploy.Load("deploy.yaml", inline(multiMistake), deploy.Options{ReadFile: memFS(nil)})
	if doc != nil || err == nil {
		t.Fatalf("Load = %v, %v; want errors", doc, err)
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 5 {
		t.Errorf("Error() has %d lines, want 5:\n%s", len(lines), err)
	}
	for _, l := range lines {
		if !errorLine.MatchString(l) {
			t.Errorf("error line %q is not deploy.yaml:LINE:COL: PATH: message", l)
		}
	}
	var one deploy.Error
	if !errors.As(err, &one) || one.Pos.Line != 10 {
		t.Errorf("errors.As(err, *deploy.Error) = %v, want the first error (line 10)", one)
	}

	// A flag has no place in a file: the path alone names it.
	_, _, errs = loadInline(t, valid3Config, deploy.Options{PD: true, Devices: "0,1"})
	if got := errs.Error(); !strings.HasPrefix(got, "--devices: need 3 devices") {
		t.Errorf("flag error = %q, want it to start with the flag name", got)
	}
}
