package main

import (
	"go/build"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/omnipd/omnipd/"

// The house's arrows, read from the packages' own imports (tests apart):
// the pure core imports nothing of ours, the public API reaches the stages
// only through the orchestrator, and the orchestrator and the reference
// engine never meet.
func TestImportsPointDown(t *testing.T) {
	rules := []struct {
		pkg    string
		tree   bool     // the packages below pkg too (reference/engine/kvcache, ...)
		banned []string // import paths below module; "" bans every package of ours
	}{
		{"topology", false, []string{""}},
		{"kvconnector", false, []string{""}},
		{"openai", false, []string{""}},
		{"stageapi", false, []string{""}},
		// The conformance suite judges every stage worker, the reference
		// one among them; it knows the stage API only as stageapi states it.
		{"stageapi/stagetest", false, []string{"reference"}},
		{"server", false, []string{"stageclient", "reference/stageconn", "reference/eccache", "reference/worker", "reference/engine", "reference/kvtransfer", "reference/mediafetch"}},
		{"orchestrator", false, []string{"reference/engine", "reference/worker", "reference/stageconn", "reference/eccache", "reference/kvtransfer", "server", "internal/cli"}},
		{"reference/engine", true, []string{"orchestrator", "server", "stageclient", "reference/worker", "internal/cli"}},
		{"reference/worker", false, []string{"orchestrator", "server", "stageclient", "internal/cli"}},
		{"vllmplan", false, []string{"reference", "launch"}},
	}
	for _, r := range rules {
		imports := ownImports(t, r.pkg, r.tree)
		for _, imp := range imports {
			for _, ban := range r.banned {
				if ban == "" || imp == ban || strings.HasPrefix(imp, ban+"/") {
					t.Errorf("%s imports %s%s", r.pkg, module, imp)
				}
			}
		}
	}
}

// ownImports lists the packages of this module that pkg (and, with tree,
// the packages below it) imports, relative to the module ("stageapi",
// "reference/engine/kvcache").
func ownImports(t *testing.T, pkg string, tree bool) []string {
	t.Helper()
	var out []string
	var walk func(dir string)
	walk = func(dir string) {
		p, err := build.ImportDir(dir, 0)
		if _, none := err.(*build.NoGoError); err != nil && !none {
			t.Fatalf("%s: %v", dir, err)
		}
		for _, imp := range p.Imports {
			if rel, ok := strings.CutPrefix(imp, module); ok && !slices.Contains(out, rel) {
				out = append(out, rel)
			}
		}
		if !tree {
			return
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.IsDir() && e.Name() != "testdata" && !strings.HasPrefix(e.Name(), ".") {
				walk(filepath.Join(dir, e.Name()))
			}
		}
	}
	walk(filepath.Join(repoRoot, pkg))
	if len(out) == 0 && pkg == "server" {
		t.Fatalf("found no imports of %s: is the test reading the right directory?", pkg)
	}
	return out
}
