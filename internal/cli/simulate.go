package cli

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/omnipd/omnipd/reference/engine/simulate"
)

// simulateUsage is the help text of --simulate.
func simulateUsage(who string) string {
	return fmt.Sprintf("run %s as a GPU latency model instead of computing: a profile file or a built-in name (%s); see docs/simulate.md",
		who, strings.Join(simulate.Builtins(), ", "))
}

// loadSimulation resolves --simulate: nil for none.
func loadSimulation(nameOrPath string) (*simulate.Profile, error) {
	if nameOrPath == "" {
		return nil, nil
	}
	p, err := simulate.Load(nameOrPath)
	if err != nil {
		return nil, fmt.Errorf("--simulate: %w", err)
	}
	return p, nil
}

// simulateWorkerArg checks serve's --simulate and returns what the workers
// it starts get: a built-in name as it is, a file as an absolute path.
func simulateWorkerArg(nameOrPath string) (string, error) {
	if _, err := loadSimulation(nameOrPath); err != nil || nameOrPath == "" {
		return "", err
	}
	if _, builtin := simulate.Builtin(nameOrPath); builtin {
		return nameOrPath, nil
	}
	abs, err := filepath.Abs(nameOrPath)
	if err != nil {
		return "", fmt.Errorf("--simulate: %w", err)
	}
	return abs, nil
}

// simulationName is what the worker's startup line says of --simulate.
func simulationName(p *simulate.Profile) string {
	if p == nil {
		return "off"
	}
	return p.Name
}
