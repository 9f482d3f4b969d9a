package deploy

import (
	"fmt"
	"sort"
	"strings"
)

// Error is one problem in a deploy config, pinned to where it was written.
type Error struct {
	Pos Pos
	// Path is the field path, e.g. stages[1].kv_transfer_config.kv_role.
	Path string
	Msg  string
	// Code is a stable identifier for topology violations; empty otherwise.
	Code string
}

func (e Error) Error() string {
	parts := make([]string, 0, 3)
	if pos := e.Pos.String(); pos != "" {
		parts = append(parts, pos)
	}
	if e.Path != "" {
		parts = append(parts, e.Path)
	}
	return strings.Join(append(parts, e.Msg), ": ")
}

// Errors is every problem found in one config, so that users fix them in one
// pass rather than one run per mistake.
type Errors []Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap exposes each problem to errors.Is and errors.As.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

func (es Errors) sorted() Errors {
	out := append(Errors(nil), es...)
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].Pos, out[j].Pos
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Col < b.Col
	})
	return out
}

// Warning is something the loader accepted but the user should know about.
type Warning struct {
	Pos  Pos
	Path string
	Msg  string
}

func (w Warning) String() string {
	return "warning: " + Error{Pos: w.Pos, Path: w.Path, Msg: w.Msg}.Error()
}

// problems collects errors and warnings while a config is loaded.
type problems struct {
	errs     Errors
	warnings []Warning
	// incomplete: part of the document could not be read (a base_config,
	// the selected platform section), so only the values written are
	// checked, not the topology they would make.
	incomplete bool
	// violations are the topology violations reported, by code and path,
	// so that one mistake seen from several stages (the prefill and the
	// decode of one Thinker) is reported once.
	violations map[string]bool
}

func (p *problems) errorf(n *Node, path, format string, args ...any) {
	p.errs = append(p.errs, Error{Pos: posOf(n), Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (p *problems) warnf(n *Node, path, format string, args ...any) {
	p.warnings = append(p.warnings, Warning{Pos: posOf(n), Path: path, Msg: fmt.Sprintf(format, args...)})
}

func posOf(n *Node) Pos {
	if n == nil {
		return Pos{}
	}
	return n.Pos
}
