package kvconnector

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Factory builds a connector's contract from its kv_connector_extra_config
// (nil when the config has none). Errors should wrap ErrInvalidConfig.
type Factory func(extra map[string]any) (Contract, error)

// Registry maps kv_connector names to contract factories. The zero value is an
// empty registry ready to use; NewRegistry holds every built-in. A registry
// is safe for concurrent use (a mutex guards the map) so that it can be
// shared by every request path of a server.
type Registry struct {
	mu        sync.RWMutex
	factories map[string]Factory
}

// NewRegistry returns a registry holding every built-in contract.
func NewRegistry() *Registry {
	r := &Registry{}
	// MultiConnector needs the registry itself to build its children, so
	// that connectors registered later can be children too.
	for _, b := range builtins(r) {
		if b.factory == nil {
			continue // an EC connector: facts only, no router contract
		}
		if err := r.Register(b.spec.Name, b.factory); err != nil {
			panic(err) // a duplicate in builtins: a programming error
		}
	}
	return r
}

// Register adds a contract factory under a kv_connector name. Registering a
// name twice is an error: a silent replacement would change how every request
// of that connector is routed.
func (r *Registry) Register(name string, factory func(extra map[string]any) (Contract, error)) error {
	if name == "" {
		return errors.New("kvconnector: register: empty connector name")
	}
	if factory == nil {
		return fmt.Errorf("kvconnector: register %s: nil factory", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.factories[name]; ok {
		return fmt.Errorf("kvconnector: register %s: already registered", name)
	}
	if r.factories == nil {
		r.factories = make(map[string]Factory)
	}
	r.factories[name] = factory
	return nil
}

// Lookup builds the contract for a connector name and its
// kv_connector_extra_config (e.g. ReferenceConnector's "handshake": "pull" or
// "push"; MultiConnector's "connectors" list). An unknown name gives an error
// wrapping ErrUnknownConnector that lists the known names.
func (r *Registry) Lookup(name string, extra map[string]any) (Contract, error) {
	r.mu.RLock()
	f, ok := r.factories[name]
	r.mu.RUnlock()
	if !ok {
		known := r.Names()
		if len(known) == 0 {
			return nil, fmt.Errorf("%w %q: no connectors are registered", ErrUnknownConnector, name)
		}
		return nil, fmt.Errorf("%w %q; known connectors are %s", ErrUnknownConnector, name, strings.Join(known, ", "))
	}
	c, err := f(extra)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if c == nil {
		return nil, fmt.Errorf("%s: %w: the factory returned no contract", name, ErrInvalidConfig)
	}
	return c, nil
}

// Names returns the registered connector names, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.factories))
	for n := range r.factories {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
