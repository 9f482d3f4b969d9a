package testbed

import (
	"fmt"
	"slices"
	"testing"
)

// Every shape of deployment the suites ask for is a deploy config that
// loads, with each stage's instances as many as asked.
func TestDeployConfigShapes(t *testing.T) {
	for _, tt := range []struct {
		opts Options
		want []string // pool: instances
	}{
		{Options{}, []string{"prefill: 1", "decode: 1"}},
		{Options{Prefills: 2, Decodes: 3, Handshake: "push", NoSharedMemory: true}, []string{"prefill: 2", "decode: 3"}},
		{Options{Colocated: true, Decodes: 2}, []string{"thinker: 2"}},
		{Options{Colocated: true, Omni: true}, []string{"thinker: 1", "talker: 1", "code2wav: 1"}},
		{Options{Encoders: 2}, []string{"encoder: 2", "prefill: 1", "decode: 1"}},
		{Options{Omni: true, AsyncChunk: true, Prefills: 2, Decodes: 2, Encoders: 1, Talkers: 2, Code2Wavs: 3},
			[]string{"encoder: 1", "prefill: 2", "decode: 2", "talker: 2", "code2wav: 3"}},
	} {
		opts := withDefaults(tt.opts)
		doc, err := loadDeployConfig(opts)
		if err != nil {
			t.Errorf("%+v: %v\n%s", tt.opts, err, DeployConfig(opts))
			continue
		}
		var got []string
		for _, s := range doc.Stages {
			got = append(got, fmt.Sprintf("%s: %d", poolName(s), len(s.Replicas)))
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%+v: stages %q, want %q", tt.opts, got, tt.want)
		}
		if doc.StreamsConditioning() != (opts.AsyncChunk && opts.Omni) {
			t.Errorf("%+v: streams conditioning %v", tt.opts, doc.StreamsConditioning())
		}
		if !opts.Colocated && doc.PD.PrefillRetries != opts.PrefillRetries {
			t.Errorf("%+v: prefill retries %d, want %d", tt.opts, doc.PD.PrefillRetries, opts.PrefillRetries)
		}
	}
}
