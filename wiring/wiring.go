// Package wiring turns a loaded deploy config and the base URLs of its
// stages into the runtime that serves it: a pool of stage clients per
// stage, the KV contract and each Thinker instance's peer, the KV done
// notices some connectors send, the Talker and Code2Wav settings the
// config carries, the readiness targets behind /health, and the
// orchestrator over all of them.
//
// Replicas with an endpoint in the config are reached there; the others
// are started by a Launcher — omnipd serve's reference worker processes,
// the e2e testbed's in-process workers — so both run the same wiring.
package wiring

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/orchestrator"
	"github.com/omnipd/omnipd/stageclient"
	"github.com/omnipd/omnipd/topology"
)

// Options are the settings of a runtime that are not the deploy config's.
// The zero value works for a config whose every replica has an endpoint.
type Options struct {
	// Secret is the deployment secret every stage call carries ("" none).
	Secret string
	// Launcher starts the replicas that name no endpoint; Build fails on
	// such a replica without one.
	Launcher Launcher
	// HTTP sends the stage calls (nil: stageclient's shared client).
	HTTP *http.Client
	// MaxStageQueue bounds the legs on each stage instance
	// (orchestrator.Pool.MaxQueue; 0: no bound).
	MaxStageQueue int
	// StageIdleTimeout and PrefillTimeout are the orchestrator's
	// (orchestrator.Config: 0 is the default, negative none).
	StageIdleTimeout time.Duration
	PrefillTimeout   time.Duration
	// PoolName names each stage's pool: the stage label of its metrics and
	// logs. Nil is DefaultPoolName.
	PoolName func(*deploy.Stage) string
	// Metrics records the orchestrator's metrics (nil: a registry of its own).
	Metrics *metrics.Orchestrator
	// Logger receives the orchestrator's, the pools' and the KV notice
	// listener's logs (nil: slog.Default()).
	Logger *slog.Logger
	// Out receives a line for each choice the config left to omnipd that
	// an operator should know of (nil: discarded).
	Out io.Writer
}

// A Launcher starts one replica that the config gives no endpoint, and
// returns once it can take requests.
type Launcher interface {
	Launch(ctx context.Context, r Replica) (Address, error)
}

// LauncherFunc adapts a function to Launcher.
type LauncherFunc func(ctx context.Context, r Replica) (Address, error)

// Launch calls f.
func (f LauncherFunc) Launch(ctx context.Context, r Replica) (Address, error) { return f(ctx, r) }

var _ Launcher = LauncherFunc(nil)

// Replica is one instance of a stage to start.
type Replica struct {
	Stage *deploy.Stage
	// Index is the replica's position in Stage.Replicas.
	Index int
	// Pool is the name of the pool the instance joins.
	Pool string
}

// Config is the replica's entry of the deploy config.
func (r Replica) Config() topology.Replica { return r.Stage.Replicas[r.Index] }

// Address is where a started replica serves.
type Address struct {
	// URL is the base URL of its API.
	URL string
	// KVPort is the port of its KV side channel, which the KV contract
	// names to its peers; 0 when it has none.
	KVPort int
}

// Runtime is a deploy config wired to its running stages.
type Runtime struct {
	// Config is what Orchestrator was made from.
	Config orchestrator.Config
	// Orchestrator drives each request across the stages.
	Orchestrator *orchestrator.Orchestrator
	// Readiness checks every stage instance: the server's /health.
	Readiness *stageclient.Readiness
	// Pools are the stages' pools, one per stage of the config, in its order.
	Pools []*orchestrator.Pool
}

// Probe keeps every pool's unhealthy instances out of rotation between
// requests, checking each every interval until ctx ends.
func (rt *Runtime) Probe(ctx context.Context, interval time.Duration) {
	for _, p := range rt.Pools {
		go p.Probe(ctx, interval)
	}
}

// DefaultPoolName is a stage's model stage, with the role of a split
// Thinker: thinker-prefill, thinker-decode, thinker-encoder; thinker,
// talker, code2wav.
func DefaultPoolName(s *deploy.Stage) string {
	if s.Role == topology.RoleFull {
		return s.ModelStage
	}
	return s.ModelStage + "-" + s.Role.String()
}

// Build wires doc: it launches the replicas without an endpoint, one after
// another in the config's order, makes a client for every instance, and
// the orchestrator over them. ctx bounds the launches and the life of the
// KV done-notice listener, for connectors that send notices.
func Build(ctx context.Context, doc *deploy.Document, o Options) (*Runtime, error) {
	if o.PoolName == nil {
		o.PoolName = DefaultPoolName
	}
	if o.Metrics == nil {
		o.Metrics = metrics.NewOrchestrator()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	rt := &Runtime{Readiness: &stageclient.Readiness{}}
	thinkers := map[topology.Role]*orchestrator.Pool{}
	audio := map[string]*orchestrator.Pool{}
	var contract kvconnector.Contract
	var prefillExtra map[string]any // the prefill's kv_connector_extra_config
	for _, s := range doc.Stages {
		if s.ModelStage != "thinker" && s.ModelStage != "talker" && s.ModelStage != "code2wav" {
			return nil, fmt.Errorf("stage %d: omnipd cannot serve model stage %q", s.ID, s.ModelStage)
		}
		pool := &orchestrator.Pool{Name: o.PoolName(s), MaxQueue: o.MaxStageQueue, Logger: o.Logger}
		rt.Pools = append(rt.Pools, pool)
		for i := range s.Replicas {
			inst, err := o.instance(ctx, s, i, pool.Name, rt.Readiness)
			if err != nil {
				return nil, err
			}
			pool.Instances = append(pool.Instances, inst)
		}
		if s.ModelStage != "thinker" {
			audio[s.ModelStage] = pool
			continue
		}
		thinkers[s.Role] = pool
		if s.Role == topology.RolePrefill {
			var err error
			if prefillExtra, err = extraConfig(s.KV); err != nil {
				return nil, fmt.Errorf("stage %d: %w", s.ID, err)
			}
			if contract, err = kvconnector.NewRegistry().Lookup(s.KV.Connector, prefillExtra); err != nil {
				return nil, err
			}
		}
	}
	cfg := orchestrator.Config{Logger: o.Logger, Metrics: o.Metrics,
		StageIdleTimeout: o.StageIdleTimeout, PrefillTimeout: o.PrefillTimeout}
	if contract != nil {
		cfg.Prefill, cfg.Decode, cfg.Contract = thinkers[topology.RolePrefill], thinkers[topology.RoleDecode], contract
		cfg.Encoder = thinkers[topology.RoleEncoder] // nil without an encoder stage
		applyPD(&cfg, doc.PD)
		var err error
		if cfg.KVReady, err = listenKVNotices(ctx, contract, prefillExtra, o.Logger); err != nil {
			return nil, err
		}
	} else {
		cfg.Decode = thinkers[topology.RoleFull]
	}
	if audio["talker"] != nil && audio["code2wav"] != nil {
		cfg.Omni = omniConfig(doc, audio["talker"], audio["code2wav"])
	}
	orch, err := orchestrator.New(cfg)
	if err != nil {
		return nil, err
	}
	rt.Config, rt.Orchestrator = cfg, orch
	return rt, nil
}

// instance reaches replica i of stage s — at its endpoint, or where the
// Launcher started it — and adds it to the readiness targets.
func (o Options) instance(ctx context.Context, s *deploy.Stage, i int, pool string, ready *stageclient.Readiness) (*orchestrator.Instance, error) {
	r := s.Replicas[i]
	url := r.Endpoint
	if url == "" {
		if o.Launcher == nil {
			return nil, fmt.Errorf("stage %d (%s): replica %d has no endpoint, and nothing starts it", s.ID, pool, i)
		}
		addr, err := o.Launcher.Launch(ctx, Replica{Stage: s, Index: i, Pool: pool})
		if err != nil {
			return nil, err
		}
		url, r.KVPort = addr.URL, addr.KVPort
	}
	client, err := stageclient.New(stageclient.Config{BaseURL: url, HTTP: o.HTTP, Secret: o.Secret})
	if err != nil {
		return nil, fmt.Errorf("stage %d: %w", s.ID, err)
	}
	ready.Targets = append(ready.Targets, stageclient.ReadyTarget{Stage: fmt.Sprintf("stage %d (%s)", s.ID, pool), Client: client})
	if s.ModelStage != "thinker" {
		return &orchestrator.Instance{Client: client}, nil
	}
	peer := thinkerPeer(s, r, url)
	if r.Endpoint != "" && r.KVPort == 0 && peer.KVPort != 0 && listensOnKVPort(s) {
		fmt.Fprintf(o.Out, "stage %d (%s): %s names no KV port; using %s's default, %d (name it in the stage's kv_transfer_config to choose)\n", s.ID, pool, url, s.KV.Connector, peer.KVPort)
	}
	return &orchestrator.Instance{Client: client, Peer: peer}, nil
}

// applyPD copies the pd: section's control-path settings.
func applyPD(cfg *orchestrator.Config, pd *deploy.PDSettings) {
	if pd == nil {
		return
	}
	cfg.PrefillRetries = pd.PrefillRetries
	cfg.MinPrefillTokens = pd.MinPrefillTokens
	cfg.FallbackLocal = pd.Fallback == "local"
}

// extraConfig is a stage's kv_connector_extra_config as the connector
// registry takes it: empty, never nil, when the config has none.
func extraConfig(kv *deploy.KVConfig) (map[string]any, error) {
	extra := map[string]any{}
	if kv == nil {
		return nil, errors.New("a prefill stage without kv_transfer_config")
	}
	if kv.ExtraConfig == nil {
		return extra, nil
	}
	raw, err := kv.ExtraConfig.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("kv_connector_extra_config: %w", err)
	}
	if err := json.Unmarshal(raw, &extra); err != nil {
		return nil, fmt.Errorf("kv_connector_extra_config: %w", err)
	}
	return extra, nil
}
