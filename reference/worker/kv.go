package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/reference/engine"
	"github.com/omnipd/omnipd/reference/engine/kvcache"
	"github.com/omnipd/omnipd/reference/kvtransfer"
	"github.com/omnipd/omnipd/stageapi"
)

// KVTransferConfig is vLLM's --kv-transfer-config JSON. The reference
// worker acts on ReferenceConnector; it accepts the other fields so that the
// same JSON works for both.
type KVTransferConfig struct {
	Connector         string         `json:"kv_connector"`
	Role              string         `json:"kv_role"`
	EngineID          string         `json:"engine_id,omitempty"`
	IP                string         `json:"kv_ip,omitempty"`
	Port              int            `json:"kv_port,omitempty"`
	BufferDevice      string         `json:"kv_buffer_device,omitempty"`
	BufferSize        any            `json:"kv_buffer_size,omitempty"`
	Rank              *int           `json:"kv_rank,omitempty"`
	ParallelSize      *int           `json:"kv_parallel_size,omitempty"`
	LoadFailurePolicy string         `json:"kv_load_failure_policy,omitempty"`
	ExtraConfig       map[string]any `json:"kv_connector_extra_config,omitempty"`
}

// Handshakes of the reference connector.
const (
	HandshakePull = "pull" // NIXL-shaped: the prefill returns block ids, the decode pulls them
	HandshakePush = "push" // Mooncake-shaped: the decode registers, the prefill pushes
)

// ReferenceConnector is the kv_connector name of omnipd's own connector.
const ReferenceConnector = kvconnector.ReferenceConnector

// ParseKVTransferConfig reads and checks --kv-transfer-config.
func ParseKVTransferConfig(s string) (*KVTransferConfig, error) {
	if s == "" {
		return nil, nil
	}
	var c KVTransferConfig
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		return nil, fmt.Errorf("--kv-transfer-config: %w", err)
	}
	if c.Connector != ReferenceConnector {
		return nil, fmt.Errorf("--kv-transfer-config: kv_connector %q: the reference worker moves KV only with %s", c.Connector, ReferenceConnector)
	}
	switch c.Role {
	case "kv_producer", "kv_consumer", "kv_both":
	default:
		return nil, fmt.Errorf("--kv-transfer-config: kv_role %q: want kv_producer, kv_consumer or kv_both", c.Role)
	}
	switch c.LoadFailurePolicy {
	case "", "fail", "recompute":
	default:
		return nil, fmt.Errorf("--kv-transfer-config: kv_load_failure_policy %q: want fail or recompute", c.LoadFailurePolicy)
	}
	if h := c.handshake(); h != HandshakePull && h != HandshakePush {
		return nil, fmt.Errorf("--kv-transfer-config: kv_connector_extra_config.handshake %q: want pull or push", h)
	}
	if c.Port < 0 || c.Port > 65535 {
		return nil, fmt.Errorf("--kv-transfer-config: kv_port %d is outside 0-65535", c.Port)
	}
	if _, err := c.leaseDuration(); err != nil {
		return nil, err
	}
	if _, err := c.sharedMemory(); err != nil {
		return nil, err
	}
	return &c, nil
}

func (c *KVTransferConfig) handshake() string {
	if h, ok := c.ExtraConfig["handshake"].(string); ok {
		return h
	}
	return HandshakePull
}

func (c *KVTransferConfig) produces() bool { return c.Role == "kv_producer" || c.Role == "kv_both" }
func (c *KVTransferConfig) consumes() bool { return c.Role == "kv_consumer" || c.Role == "kv_both" }

// leaseDuration reads kv_connector_extra_config.lease_seconds (default 30,
// as NIXL's kv_lease_duration).
func (c *KVTransferConfig) leaseDuration() (time.Duration, error) {
	v, ok := c.ExtraConfig["lease_seconds"]
	if !ok {
		return 0, nil
	}
	f, ok := v.(float64)
	if !ok || f <= 0 {
		return 0, fmt.Errorf("--kv-transfer-config: kv_connector_extra_config.lease_seconds: want a positive number of seconds, got %v", v)
	}
	return time.Duration(f * float64(time.Second)), nil
}

// sharedMemory reads kv_connector_extra_config.shared_memory (default
// true): whether KV moves through shared memory between a prefill and a
// decode on the same host rather than over the side channel's TCP.
func (c *KVTransferConfig) sharedMemory() (bool, error) {
	v, ok := c.ExtraConfig["shared_memory"]
	if !ok {
		return true, nil
	}
	b, ok := v.(bool)
	if !ok {
		return false, fmt.Errorf("--kv-transfer-config: kv_connector_extra_config.shared_memory: want true or false, got %v", v)
	}
	return b, nil
}

// kvPath is the worker's end of the reference connector.
type kvPath struct {
	cfg      *KVTransferConfig
	producer *kvtransfer.Producer
	consumer *kvtransfer.Consumer
	host     string
	port     int
	// region holds the engine's cache when the worker produces KV with
	// shared memory on; see shareCache. mu guards it against two Closes.
	mu      sync.Mutex
	region  *kvtransfer.SharedMemory
	cache   *kvcache.Cache
	cleanup runtime.Cleanup
}

// newKVPath opens the worker's end of the reference connector; a producer's
// side channel serves on ln when it is set (see Config.KVListener).
func newKVPath(cfg *KVTransferConfig, ln net.Listener, e *engine.Engine, secret string, log *slog.Logger) (*kvPath, error) {
	if ln != nil {
		if cfg == nil || !cfg.produces() {
			who := "a worker without --kv-transfer-config"
			if cfg != nil {
				who = "a " + cfg.Role + " worker"
			}
			return nil, fmt.Errorf("worker: a KV side channel listener for %s, which opens no side channel (only kv_producer and kv_both do)", who)
		}
		// The port is what the config tells peers; a listener elsewhere
		// would have them dial a port nobody serves.
		switch a, ok := ln.Addr().(*net.TCPAddr); {
		case !ok:
			return nil, fmt.Errorf("worker: the KV side channel's listener is on %s %s; want TCP", ln.Addr().Network(), ln.Addr())
		case cfg.Port != 0 && a.Port != cfg.Port:
			return nil, fmt.Errorf("worker: the KV side channel's listener is on %s, but --kv-transfer-config's kv_port is %d", a, cfg.Port)
		}
	}
	if cfg == nil {
		return nil, nil
	}
	lease, _ := cfg.leaseDuration()
	shared, _ := cfg.sharedMemory()
	kc := kvtransfer.Config{
		EngineID:            cfg.EngineID,
		Secret:              secret,
		LeaseDuration:       lease,
		Shape:               fmt.Sprint(e.Cache().Shape()),
		DisableSharedMemory: !shared,
	}
	store := kvtransfer.CacheStore(e.Cache())
	k := &kvPath{cfg: cfg}
	if cfg.produces() {
		if cfg.EngineID == "" {
			return nil, errors.New("--kv-transfer-config: a KV producer needs an explicit engine_id so that decodes can name it")
		}
		if shared {
			store = k.shareCache(e.Cache(), store, log)
		}
		ip := cfg.IP
		if ip == "" {
			ip = "127.0.0.1"
		}
		kc.ListenAddr, kc.Listener = net.JoinHostPort(ip, strconv.Itoa(cfg.Port)), ln
		p, err := kvtransfer.NewProducer(kc, store)
		if err != nil {
			k.unshareCache(log)
			return nil, fmt.Errorf("start the KV side channel: %w", err)
		}
		k.producer = p
		host, port, _ := net.SplitHostPort(p.Addr().String())
		k.host = host
		k.port, _ = strconv.Atoi(port)
	}
	if cfg.consumes() {
		k.consumer = kvtransfer.NewConsumer(kc, store)
	}
	return k, nil
}

// shareCache moves the engine's cache into shared memory, so that decodes
// on this host copy exported blocks straight out of it instead of receiving
// them over TCP, and returns the store to export from. Where that cannot be
// done (not Linux, no memfd, a cache already in use) KV goes over TCP and
// store is returned as it is.
//
// The engine was built, and is running, before the worker: its cache can
// move only while no block is allocated, which holds now, before the worker
// serves anything. The region then backs the cache for as long as the
// engine may use it: close moves the cache back out and closes the region
// if the engine is idle by then, and if it is not, the region is closed
// once the cache is garbage.
func (k *kvPath) shareCache(cache *kvcache.Cache, store kvtransfer.BlockStore, log *slog.Logger) kvtransfer.BlockStore {
	region, err := kvtransfer.NewSharedMemory(cache.NumBlocks() * cache.Shape().BlockBytes())
	if err != nil {
		level := slog.LevelWarn
		if errors.Is(err, errors.ErrUnsupported) {
			level = slog.LevelDebug
		}
		log.Log(context.Background(), level, "KV cache not in shared memory; decodes on this host receive KV over TCP", "err", err)
		return store
	}
	if err := cache.MoveTo(region.Float32s()); err != nil {
		region.Close()
		log.Warn("KV cache not in shared memory; decodes on this host receive KV over TCP", "err", err)
		return store
	}
	k.region, k.cache = region, cache
	k.cleanup = runtime.AddCleanup(cache, func(r *kvtransfer.SharedMemory) { r.Close() }, region)
	log.Info("KV cache in shared memory: decodes on this host copy its blocks from there", "bytes", len(region.Bytes()))
	return kvtransfer.SharedCacheStore(cache, region)
}

// unshareCache gives the cache memory of its own back and closes the
// region, unless the engine holds blocks: then the region stays until the
// cache is garbage.
func (k *kvPath) unshareCache(log *slog.Logger) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.region == nil {
		return
	}
	if err := k.cache.MoveTo(nil); err != nil {
		log.Debug("KV cache stays in shared memory until the engine is gone", "err", err)
		return
	}
	k.cleanup.Stop()
	k.region.Close()
	k.region, k.cache = nil, nil
}

func (k *kvPath) close(log *slog.Logger) {
	if k == nil {
		return
	}
	if k.producer != nil {
		k.producer.Close()
	}
	if k.consumer != nil {
		// Its idle connections hold the producers' handlers open.
		k.consumer.Close()
	}
	k.unshareCache(log)
}

// LeasedBlocks, ExpiredLeases and Imports feed the worker's metrics.
func (k *kvPath) LeasedBlocks() int {
	if k.producer == nil {
		return 0
	}
	return k.producer.Stats().LeasedBlocks
}

// Imports counts the consumer's completed imports by path (metrics).
func (k *kvPath) Imports() (ticket, sharedMemory, tcp uint64) {
	if k.consumer == nil {
		return 0, 0, 0
	}
	st := k.consumer.Stats()
	return st.TicketTransfers, st.SharedTransfers - st.TicketTransfers, st.StreamedTransfers
}

func (k *kvPath) ExpiredLeases() uint64 {
	if k.producer == nil {
		return 0
	}
	return k.producer.Stats().Expired
}

// paramError is a kv_transfer_params problem the client caused: HTTP 400,
// never a crash (a malformed do_remote_prefill is what crashes engines in
// the field).
type paramError struct{ msg string }

func (e *paramError) Error() string { return "kv_transfer_params: " + e.msg }

// kvPlan is what one request asks of the KV path.
type kvPlan struct {
	export  bool
	key     string // lease key: request id (pull) or transfer_id (push)
	imports bool
	// import source
	addr, engineID string
	push           bool
	// response: the producer's block ids, filled in on export (pull)
	blocks []int
	// ticket lets a decode on this host copy the blocks out of the
	// producer's shared memory without asking (remote_shm; pull only).
	ticket string
}

// plan reads a request's kv_transfer_params. requestID keys pull transfers.
func (k *kvPath) plan(params map[string]any, requestID string) (*kvPlan, error) {
	if len(params) == 0 {
		return nil, nil
	}
	if k == nil {
		return nil, &paramError{"this worker has no KV connector (start it with --kv-transfer-config)"}
	}
	remoteDecode, _ := params["do_remote_decode"].(bool)
	remotePrefill, _ := params["do_remote_prefill"].(bool)
	push := k.cfg.handshake() == HandshakePush
	switch {
	case remoteDecode && remotePrefill:
		return nil, &paramError{"do_remote_decode and do_remote_prefill are both true"}
	case remoteDecode:
		if k.producer == nil {
			return nil, &paramError{fmt.Sprintf("do_remote_decode on a %s worker; it cannot export KV", k.cfg.Role)}
		}
		pl := &kvPlan{export: true, key: requestID}
		if push {
			id, err := stringParam(params, "transfer_id")
			if err != nil {
				return nil, err
			}
			pl.key = id
		}
		return pl, nil
	case remotePrefill:
		if k.consumer == nil {
			return nil, &paramError{fmt.Sprintf("do_remote_prefill on a %s worker; it cannot import KV", k.cfg.Role)}
		}
		engineID, err := stringParam(params, "remote_engine_id")
		if err != nil {
			return nil, err
		}
		pl := &kvPlan{imports: true, engineID: engineID, push: push}
		if push {
			if pl.key, err = stringParam(params, "transfer_id"); err != nil {
				return nil, err
			}
			bootstrap, err := stringParam(params, "remote_bootstrap_addr")
			if err != nil {
				return nil, err
			}
			u, perr := url.Parse(bootstrap)
			if perr != nil || u.Host == "" {
				return nil, &paramError{fmt.Sprintf("remote_bootstrap_addr %q: want http://HOST:PORT", bootstrap)}
			}
			pl.addr = u.Host
			return pl, nil
		}
		if pl.key, err = stringParam(params, "remote_request_id"); err != nil {
			return nil, err
		}
		host, err := stringParam(params, "remote_host")
		if err != nil {
			return nil, err
		}
		port, ok := params["remote_port"].(float64)
		if !ok || port < 1 || port > 65535 || port != float64(int(port)) {
			return nil, &paramError{fmt.Sprintf("remote_port %v: want a port number", params["remote_port"])}
		}
		if _, ok := params["remote_block_ids"].([]any); !ok {
			return nil, &paramError{"remote_block_ids: want a list of block ids"}
		}
		if t, ok := params["remote_shm"]; ok {
			if pl.ticket, ok = t.(string); !ok {
				return nil, &paramError{"remote_shm: want the prefill's ticket, a string"}
			}
		}
		pl.addr = net.JoinHostPort(host, strconv.Itoa(int(port)))
		return pl, nil
	}
	return nil, nil
}

func stringParam(params map[string]any, key string) (string, error) {
	v, ok := params[key].(string)
	if !ok || v == "" {
		return "", &paramError{fmt.Sprintf("%s: missing or not a string", key)}
	}
	return v, nil
}

// exporter hands a finished prefill's blocks to the side channel.
func (k *kvPath) exporter(pl *kvPlan) engine.KVExport {
	return func(blocks []int, n int) error {
		pl.blocks = append([]int(nil), blocks...)
		if err := k.producer.Export(pl.key, blocks, n); err != nil {
			return err
		}
		pl.ticket = k.producer.Ticket(pl.key)
		return nil
	}
}

// importer fetches a decode's prompt KV from its prefill. When the request
// is abandoned before its blocks arrived, the prefill is told to drop them
// rather than hold them until the lease runs out.
func (k *kvPath) importer(pl *kvPlan, done *bool) engine.KVImport {
	return func(ctx context.Context, dst []int) (int, error) {
		var n int
		var err error
		if pl.push {
			n, err = k.consumer.Receive(ctx, pl.addr, pl.engineID, pl.key, dst)
		} else {
			n, err = k.consumer.PullWithTicket(ctx, pl.addr, pl.engineID, pl.key, pl.ticket, dst)
		}
		*done = err == nil
		if err != nil && !errors.Is(err, kvtransfer.ErrUnknownTransfer) && !errors.Is(err, kvtransfer.ErrBusy) {
			// Nobody will claim this transfer again — the request was
			// abandoned, fails (kv_load_failure_policy fail) or computes
			// the prompt itself (recompute) — so the prefill's copy is
			// freed now rather than when its lease runs out. A busy
			// transfer belongs to another consumer; leave it be.
			k.release(pl)
		}
		return n, err
	}
}

// release drops an import's remote lease, in the background and bounded.
func (k *kvPath) release(pl *kvPlan) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = k.consumer.ReleaseRemote(ctx, pl.addr, pl.key)
	}()
}

// responseParams is the kv_transfer_params a finished request returns:
// where the decode pulls from (pull), or null (push, as Mooncake). Besides
// NIXL's keys it carries remote_shm, the producer's ticket, when the blocks
// lie in shared memory: routers pass the object on as it is, and a decode
// that does not know the key ignores it.
func (k *kvPath) responseParams(pl *kvPlan, requestID string) any {
	if pl == nil || !pl.export || k.cfg.handshake() == HandshakePush || pl.blocks == nil {
		return nil
	}
	params := map[string]any{
		"do_remote_prefill": true,
		"do_remote_decode":  false,
		"remote_engine_id":  k.cfg.EngineID,
		"remote_block_ids":  pl.blocks,
		"remote_host":       k.host,
		"remote_port":       k.port,
		"remote_request_id": requestID,
		"tp_size":           1,
	}
	if pl.ticket != "" {
		params["remote_shm"] = pl.ticket
	}
	return params
}

// kvReleaseRoute is the route of releaseKV.
const kvReleaseRoute = "POST " + stageapi.KVReleasePath

// releaseKV serves stageapi.KVReleasePath: the router's release of a
// request that is gone — cancelled, or failed on the way to its decode —
// by lease key. The lease is dropped now; a key not exported yet is
// refused at its export (kvtransfer.Producer.Revoke). Like every route but
// /health and /metrics it sits behind the deployment secret.
func (s *Server) releaseKV(w http.ResponseWriter, r *http.Request) error {
	if s.kv == nil || s.kv.producer == nil {
		return openai.InvalidRequest("key", "this worker exports no KV (it is not a kv_producer)")
	}
	var req struct {
		Key string `json:"key"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10)).Decode(&req); err != nil || req.Key == "" {
		return openai.InvalidRequest("key", `want {"key": "<lease key>"}`)
	}
	if s.kv.producer.Revoke(req.Key) {
		s.log.Debug("released the KV of a request that is gone", "request_id", requestID(r.Context()), "key", req.Key)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
