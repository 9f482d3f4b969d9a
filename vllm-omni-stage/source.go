// Package vllmomnistage carries omnipd's vllm-omni stage worker — the
// Python package omnipd_stage, which runs one stage of a Qwen3-Omni pipeline
// on vllm-omni's model code behind omnipd's contracts — as files the plans
// write out: a shell plan writes them into a directory on PYTHONPATH, a
// Kubernetes plan puts them in a ConfigMap the stage pods mount. Go code
// never runs them; it only hands them on.
package vllmomnistage

import (
	"embed"
	"io/fs"
	"path"
	"slices"
	"strings"
)

// VLLMOmniVersion is the vllm-omni release the stage worker is written
// against, and checks at start-up (WRITTEN_AGAINST in
// omnipd_stage/interfaces.py): github.com/vllm-project/vllm-omni, tag
// v0.32.0, which requires vLLM 0.32.0. It is the version to pip install
// beside the worker, and vllm-omni's release image is tagged v<version>
// (.buildkite/release/scripts/publish-release-images.sh at vllm-omni
// bc714c00).
const VLLMOmniVersion = "0.32.0"

// Package is the worker's Python package: python3 -m omnipd_stage, with
// the directory holding it on PYTHONPATH.
const Package = "omnipd_stage"

//go:embed omnipd_stage/*.py
var sources embed.FS

// File is one file of the worker.
type File struct {
	// Name is the file's path below the directory on PYTHONPATH, with
	// forward slashes: "omnipd_stage/__init__.py".
	Name string
	Data []byte
}

// Base is the file's name within the package directory ("__init__.py").
func (f File) Base() string { return path.Base(f.Name) }

// Files returns the worker's files, sorted by name. Each call returns a
// fresh copy.
func Files() []File {
	entries, err := fs.ReadDir(sources, Package)
	if err != nil {
		// The embed pattern guarantees the directory; a build without it
		// does not compile.
		panic(err)
	}
	var files []File
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".py") {
			continue
		}
		name := Package + "/" + e.Name()
		data, err := sources.ReadFile(name)
		if err != nil {
			panic(err)
		}
		files = append(files, File{Name: name, Data: data})
	}
	slices.SortFunc(files, func(a, b File) int { return strings.Compare(a.Name, b.Name) })
	return files
}
