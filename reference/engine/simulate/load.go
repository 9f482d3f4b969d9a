package simulate

import (
	"embed"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
)

// The built-in profiles, each documented in its own file.
//
//go:embed profiles/*.yaml
var builtins embed.FS

// maxProfileBytes bounds a profile file; real ones are a few KiB.
const maxProfileBytes = 1 << 20

// Builtins lists the names of the embedded profiles, sorted.
func Builtins() []string {
	entries, _ := builtins.ReadDir("profiles")
	var names []string
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	slices.Sort(names)
	return names
}

// Builtin returns the embedded profile name's file, as it is written.
func Builtin(name string) ([]byte, bool) {
	if name == "" || strings.ContainsAny(name, `/\`) {
		return nil, false
	}
	b, err := builtins.ReadFile(path.Join("profiles", name+".yaml"))
	return b, err == nil
}

// Load returns the built-in profile called nameOrPath, or else reads and
// parses the file at that path.
func Load(nameOrPath string) (*Profile, error) {
	if b, ok := Builtin(nameOrPath); ok {
		return Parse(nameOrPath+".yaml", b)
	}
	f, err := os.Open(nameOrPath)
	if err != nil {
		return nil, fmt.Errorf("simulation profile %q: not a built-in profile (%s) and not a readable file: %w", nameOrPath, strings.Join(Builtins(), ", "), err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxProfileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("simulation profile %s: %w", nameOrPath, err)
	}
	if len(b) > maxProfileBytes {
		return nil, fmt.Errorf("simulation profile %s: larger than %d bytes", nameOrPath, maxProfileBytes)
	}
	return Parse(nameOrPath, b)
}
