package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/kvnotice"
	"github.com/omnipd/omnipd/stageclient"
	"net/http/httptest"
	"testing"
)

// HTTP protocol fakes of vllm serve engines with a KV connector, as the
// router meets them. Each fake reads from a leg what the real connector
// reads (kv_transfer_params, X-Request-Id and the internal request id vLLM
// derives from it), answers what the real one answers (the top-level
// kv_transfer_params of a non-streamed answer), and on the decode side
// either imports the prefill's KV, recomputes the prompt (what vLLM does
// when the connector claims nothing), or fails the leg where vLLM would
// fail or hang — recording the problem instead of hanging, so that a test
// can name it.
//
// Upstream read (vllm-project/vllm unless said otherwise):
//   - NIXL: vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py,
//     NixlConnectorScheduler.request_finished (keys of the prefill answer;
//     remote_block_ids one list per KV-cache group in newer versions, with
//     remote_request_id, remote_num_tokens) and get_num_new_matched_tokens
//     (claims only with do_remote_prefill).
//   - llm-d/llm-d-inference-sim pkg/api/response.go @eec055a3,
//     BuildPrefillKVTransferParams: do_remote_prefill, remote_block_ids
//     ["DUMMY_ID"], remote_engine_id, remote_host, remote_port, tp_size — no
//     remote_request_id.
//   - Mooncake: vllm/distributed/kv_transfer/kv_connector/v1/mooncake/
//     mooncake_connector.py @5c512330, MooncakeConnectorMetadata.add_new_req:
//     transfer_id on both legs, remote_engine_id and remote_bootstrap_addr on
//     the decode (KeyError without them); the prefill answers null.
//   - P2pNccl: vllm/distributed/kv_transfer/kv_connector/v1/p2p/
//     p2p_nccl_connector.py @02dc4a14: parse_request_id's regexes; the
//     consumer's get_num_new_matched_tokens claims len(prompt)-1 tokens for
//     every request, and start_load_kv waits for the tensors under its own
//     request id, so a decode with no prefill waits for ever.
//   - LMCache: vllm/distributed/kv_transfer/kv_connector/v1/
//     lmcache_connector.py @7ded96b3 (content-addressed lookup; a miss is
//     recomputed); PD mode: LMCache's disagg_proxy_server.py, whose prefill
//     leg carries kv_transfer_params {"ret_first_tok": true, "disagg_spec":
//     {req_id, receiver_host, receiver_init_port, receiver_alloc_port}} —
//     without it the sender pushes the KV to no decoder.
//   - MoRIIO: vllm/distributed/kv_transfer/kv_connector/v1/moriio/
//     moriio_connector.py @6fbdff48 (read mode: transfer_id on both legs,
//     remote_block_ids and remote_engine_id on the decode).
//   - vLLM ≥ 0.14 appends a random suffix to every internal request id unless
//     VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1 (vllm/envs.py); the chat API
//     prefixes "chatcmpl-", completions "cmpl-".

// engineLeg is one call as the engine sees it.
type engineLeg struct {
	ctx        context.Context // the HTTP request's: done when omnipd drops the leg
	xRequestID string
	internalID string         // the engine's request id
	params     map[string]any // kv_transfer_params; nil when none was sent
	prompt     string
	body       map[string]any
}

// kvExport is KV a prefill engine holds for a decode, by the connector's key.
type kvExport struct {
	prompt     string
	internalID string
	blocks     any            // remote_block_ids as the prefill answered them
	response   map[string]any // the prefill's kv_transfer_params, as decoded
	ready      chan struct{}  // closed once exported
	exported   bool
	imported   bool
	// freed: the prefill freed the blocks because the decode it was for
	// refused the request (vLLM ≥ 0.21; claim_test.go).
	freed bool
}

// kvFabric is the data path between one prefill engine and one decode
// engine: what was exported, under which key.
type kvFabric struct {
	mu      sync.Mutex
	exports map[string]*kvExport
}

func (f *kvFabric) entry(key string) *kvExport {
	if f.exports == nil {
		f.exports = map[string]*kvExport{}
	}
	e, ok := f.exports[key]
	if !ok {
		e = &kvExport{ready: make(chan struct{})}
		f.exports[key] = e
	}
	return e
}

func (f *kvFabric) export(key string, e kvExport) {
	f.mu.Lock()
	defer f.mu.Unlock()
	x := f.entry(key)
	x.prompt, x.internalID, x.blocks, x.response = e.prompt, e.internalID, e.blocks, e.response
	if !x.exported {
		x.exported = true
		close(x.ready)
	}
}

// await returns the export under key once it exists, waiting at most
// bound for it (a concurrent decode may come first); nil when it never
// came — where the real engine would wait for ever.
func (f *kvFabric) await(ctx context.Context, key string, bound time.Duration) *kvExport {
	f.mu.Lock()
	e := f.entry(key)
	f.mu.Unlock()
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-e.ready:
		return e
	case <-t.C:
		return nil
	case <-ctx.Done():
		// omnipd dropped the leg (its prefill failed): the engine would
		// abort the request too.
		return nil
	}
}

// lookup returns the export under key, if any.
func (f *kvFabric) lookup(key string) *kvExport {
	f.mu.Lock()
	defer f.mu.Unlock()
	if e, ok := f.exports[key]; ok && e.exported {
		return e
	}
	return nil
}

// Decode outcomes.
const (
	outcomeImported   = "imported"
	outcomeRecomputed = "recomputed"
)

// engineModel is one connector's behaviour inside an engine.
type engineModel interface {
	// prefill returns the answer's kv_transfer_params (nil: null), or a
	// problem: what goes wrong inside the real engine.
	prefill(e *vllmEngine, l engineLeg) (resp map[string]any, problem string)
	// decode returns what the decode did with the KV, or a problem.
	decode(e *vllmEngine, l engineLeg) (outcome, problem string)
}

// vllmEngine is one vllm serve instance behind an httptest server.
type vllmEngine struct {
	role   string // "prefill" or "decode"
	peer   kvconnector.Peer
	other  kvconnector.Peer // the peer instance of the pair
	model  engineModel
	fabric *kvFabric
	// randomize: the engine appends a suffix to internal request ids (vLLM
	// ≥ 0.14 without VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1).
	randomize bool
	// unavailable answers every leg 503, as an engine that is loading does.
	unavailable bool
	// version is what GET /version answers ("": 404, as a reference
	// worker or a proxy does).
	version string
	// rejects, when set, picks the decode legs the engine refuses with 400
	// before admission, as vLLM's frontend refuses a max_tokens past the
	// context (claim_test.go).
	rejects func(engineLeg) bool
	// notices receives the done notices a sender pushes out of band
	// (LMCache PD mode), where omnipd serve's kvnotice.Listener would.
	notices *noticeBoard
	// down are decode instances of the deployment that are dead: a prefill
	// may be addressed to one (its decode was chosen before it died), and
	// the KV it sends there goes nowhere.
	down []kvconnector.Peer

	mu       sync.Mutex
	legs     []engineLeg
	problems []string
	outcomes []string
	n        int
}

func (e *vllmEngine) problem(format string, args ...any) string {
	return fmt.Sprintf("%s engine: %s", e.role, fmt.Sprintf(format, args...))
}

func (e *vllmEngine) record(l engineLeg, outcome, problem string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.legs = append(e.legs, l)
	if outcome != "" {
		e.outcomes = append(e.outcomes, outcome)
	}
	if problem != "" {
		e.problems = append(e.problems, problem)
	}
}

func (e *vllmEngine) snapshot() (legs []engineLeg, outcomes, problems []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]engineLeg(nil), e.legs...), append([]string(nil), e.outcomes...), append([]string(nil), e.problems...)
}

func (e *vllmEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/version" {
		e.serveVersion(w)
		return
	}
	raw, _ := io.ReadAll(r.Body)
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		http.Error(w, `{"error":{"message":"bad json"}}`, http.StatusBadRequest)
		return
	}
	if r.URL.Path == "/tokenize" {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"count":%d,"max_model_len":4096,"tokens":[]}`, len(promptOf(body)))
		return
	}
	chat := r.URL.Path == "/v1/chat/completions"
	if !chat && r.URL.Path != "/v1/completions" {
		http.NotFound(w, r)
		return
	}
	if e.unavailable {
		e.record(engineLeg{xRequestID: r.Header.Get("X-Request-Id"), body: body}, "", "")
		http.Error(w, `{"error":{"message":"engine is loading","type":"ServiceUnavailable","code":503}}`, http.StatusServiceUnavailable)
		return
	}
	l := engineLeg{ctx: r.Context(), xRequestID: r.Header.Get("X-Request-Id"), prompt: promptOf(body), body: body}
	if p, ok := body["kv_transfer_params"].(map[string]any); ok {
		l.params = p
	}
	// vLLM names the request after X-Request-Id (a fresh uuid without one),
	// prefixed by the API, then (≥ 0.14) suffixed at random.
	l.internalID = "cmpl-" + l.xRequestID
	if chat {
		l.internalID = "chatcmpl-" + l.xRequestID
	}
	if e.randomize {
		e.mu.Lock()
		e.n++
		l.internalID += fmt.Sprintf("-%08x", 0x5eed0000+e.n)
		e.mu.Unlock()
	}
	if e.role == "prefill" {
		e.servePrefill(w, l, chat)
		return
	}
	e.serveDecode(w, l, chat)
}

func (e *vllmEngine) servePrefill(w http.ResponseWriter, l engineLeg, chat bool) {
	var problems []string
	// The answer carries kv_transfer_params only when not streamed, and the
	// connectors keep KV only for a request capped by length at one token.
	if s, _ := l.body["stream"].(bool); s {
		problems = append(problems, e.problem("stream: true: the answer carries no kv_transfer_params"))
	}
	if n, _ := l.body["max_tokens"].(float64); n != 1 {
		problems = append(problems, e.problem("max_tokens %v, want 1", l.body["max_tokens"]))
	}
	if v, ok := l.body["max_completion_tokens"]; ok && v != float64(1) {
		problems = append(problems, e.problem("max_completion_tokens %v, want 1", v))
	}
	resp, problem := e.model.prefill(e, l)
	if problem != "" {
		problems = append(problems, problem)
	}
	e.record(l, "", strings.Join(problems, "; "))
	if problem != "" {
		engineError(w, problem)
		return
	}
	kv := "null"
	if resp != nil {
		b, _ := json.Marshal(resp)
		kv = string(b)
	}
	w.Header().Set("Content-Type", "application/json")
	if chat {
		fmt.Fprintf(w, `{"id":%q,"object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"length"}],"usage":{"prompt_tokens":%d,"completion_tokens":1,"total_tokens":%d},"kv_transfer_params":%s}`,
			l.internalID, len(l.prompt), len(l.prompt)+1, kv)
		return
	}
	fmt.Fprintf(w, `{"id":%q,"object":"text_completion","model":"m","choices":[{"index":0,"text":"a","finish_reason":"length"}],"usage":{"prompt_tokens":%d,"completion_tokens":1,"total_tokens":%d},"kv_transfer_params":%s}`,
		l.internalID, len(l.prompt), len(l.prompt)+1, kv)
}

// decodeText is what every fake decode generates.
var decodeText = []string{"hel", "lo"}

func (e *vllmEngine) serveDecode(w http.ResponseWriter, l engineLeg, chat bool) {
	if e.rejects != nil && e.rejects(l) {
		e.reject(w, l)
		return
	}
	outcome, problem := e.model.decode(e, l)
	if l.ctx.Err() != nil {
		// omnipd dropped the leg before it ended (a concurrent decode whose
		// prefill failed): the engine aborts it, and nobody reads an answer.
		return
	}
	e.record(l, outcome, problem)
	if problem != "" {
		engineError(w, problem)
		return
	}
	if s, _ := l.body["stream"].(bool); s {
		w.Header().Set("Content-Type", "text/event-stream")
		for i, piece := range decodeText {
			finish := "null"
			if i == len(decodeText)-1 {
				finish = `"stop"`
			}
			if chat {
				fmt.Fprintf(w, "data: {\"id\":%q,\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":%s}]}\n\n", l.internalID, piece, finish)
			} else {
				fmt.Fprintf(w, "data: {\"id\":%q,\"object\":\"text_completion\",\"model\":\"m\",\"choices\":[{\"index\":0,\"text\":%q,\"finish_reason\":%s}]}\n\n", l.internalID, piece, finish)
			}
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	text := strings.Join(decodeText, "")
	if chat {
		fmt.Fprintf(w, `{"id":%q,"object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":2,"total_tokens":%d},"kv_transfer_params":null}`,
			l.internalID, text, len(l.prompt), len(l.prompt)+2)
		return
	}
	fmt.Fprintf(w, `{"id":%q,"object":"text_completion","model":"m","choices":[{"index":0,"text":%q,"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":2,"total_tokens":%d},"kv_transfer_params":null}`,
		l.internalID, text, len(l.prompt), len(l.prompt)+2)
}

// engineError is vLLM's answer to a request that failed inside the engine
// (a KeyError in the connector, a failed KV load with
// kv_load_failure_policy: fail): HTTP 500.
func engineError(w http.ResponseWriter, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusInternalServerError)
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": "InternalServerError", "code": 500}})
	_, _ = w.Write(b)
}

// promptOf stands for the prompt's tokens: the KV that must arrive.
func promptOf(body map[string]any) string {
	if msgs, ok := body["messages"].([]any); ok {
		var b strings.Builder
		for _, m := range msgs {
			mm, _ := m.(map[string]any)
			fmt.Fprintf(&b, "<%v>%v", mm["role"], mm["content"])
		}
		return b.String()
	}
	if p, ok := body["prompt"].(string); ok {
		return p
	}
	b, _ := json.Marshal(body["prompt"])
	return string(b)
}

func flagOf(params map[string]any, key string) bool { b, _ := params[key].(bool); return b }

func sideChannel(p kvconnector.Peer) string {
	return net.JoinHostPort(p.KVHost, strconv.Itoa(p.KVPort))
}

// awaitBound bounds how long a fake decode waits for KV that a concurrent
// prefill may still be exporting; past it the real engine would wait on.
const awaitBound = 5 * time.Second

// nixlShape is the NIXL prefill answer a version of the engine gives.
type nixlShape int

const (
	// nixlMain: vLLM main — remote_block_ids a list per KV-cache group,
	// remote_request_id (the randomized internal id), remote_num_tokens.
	nixlMain nixlShape = iota
	// nixlNoRequestID: an engine that predates remote_request_id: flat
	// block ids, no remote_request_id, internal ids not randomized, and the
	// decode notifies the prefill under its own request id, which is the
	// prefill's when both legs carry one X-Request-Id.
	nixlNoRequestID
	// nixlSim: llm-d-inference-sim (pkg/api/response.go @eec055a3): fixed
	// placeholder values, no remote_request_id; its decode pulls nothing.
	nixlSim
)

// nixlModel is NixlConnector (and omnipd's reference connector in pull
// mode, which answers the same keys with X-Request-Id as
// remote_request_id).
type nixlModel struct {
	shape     nixlShape
	reference bool
}

func (m nixlModel) prefill(e *vllmEngine, l engineLeg) (map[string]any, string) {
	if !flagOf(l.params, "do_remote_decode") || flagOf(l.params, "do_remote_prefill") {
		return nil, e.problem("kv_transfer_params %v do not ask for a remote decode: the blocks are freed when the request ends", l.params)
	}
	if m.shape == nixlSim {
		return map[string]any{"do_remote_decode": false, "do_remote_prefill": true, "remote_block_ids": []string{"DUMMY_ID"},
			"remote_engine_id": "DUMMY_ID", "remote_host": "DUMMY", "remote_port": 1234, "tp_size": 1}, ""
	}
	e.mu.Lock()
	e.n++
	n := e.n
	e.mu.Unlock()
	resp := map[string]any{
		"do_remote_prefill": true, "do_remote_decode": false,
		"remote_engine_id": e.peer.EngineID, "remote_host": e.peer.KVHost, "remote_port": e.peer.KVPort,
		"tp_size": 1,
	}
	key := l.internalID
	switch {
	case m.reference:
		key = l.xRequestID
		resp["remote_block_ids"] = []int{n * 10, n*10 + 1}
		resp["remote_request_id"] = key
	case m.shape == nixlMain:
		resp["remote_block_ids"] = [][]int{{n * 10, n*10 + 1}}
		resp["remote_request_id"] = key
		resp["remote_num_tokens"] = len(l.prompt)
	default:
		resp["remote_block_ids"] = []int{n * 10, n*10 + 1}
	}
	raw, _ := json.Marshal(resp)
	var decoded map[string]any
	_ = json.Unmarshal(raw, &decoded)
	e.fabric.export(key, kvExport{prompt: l.prompt, internalID: l.internalID, blocks: decoded["remote_block_ids"], response: decoded})
	return resp, ""
}

func (m nixlModel) decode(e *vllmEngine, l engineLeg) (string, string) {
	p := l.params
	if !flagOf(p, "do_remote_prefill") {
		return outcomeRecomputed, ""
	}
	if flagOf(p, "do_remote_decode") {
		return "", e.problem("do_remote_prefill and do_remote_decode both true")
	}
	if m.shape == nixlSim {
		return outcomeImported, ""
	}
	required := []string{"remote_block_ids", "remote_engine_id", "remote_host", "remote_port"}
	if m.shape == nixlMain || m.reference {
		required = append(required, "remote_request_id")
	}
	for _, k := range required {
		if _, ok := p[k]; !ok {
			return "", e.problem("KeyError: %q in kv_transfer_params %v", k, p)
		}
	}
	host, _ := p["remote_host"].(string)
	port, _ := p["remote_port"].(float64)
	if addr := net.JoinHostPort(host, strconv.Itoa(int(port))); addr != sideChannel(e.other) {
		return "", e.problem("NIXL handshake with %s: nothing listens there (the prefill's side channel is %s)", addr, sideChannel(e.other))
	}
	if id, _ := p["remote_engine_id"].(string); id != e.other.EngineID {
		return "", e.problem("remote_engine_id %q, the prefill is %q", id, e.other.EngineID)
	}
	key, _ := p["remote_request_id"].(string)
	if m.shape == nixlNoRequestID {
		key = l.internalID // the decode notifies under its own id
	}
	x := e.fabric.lookup(key)
	if x == nil {
		return "", e.problem("KV load failed: the prefill holds no blocks for request %q", key)
	}
	if x.freed {
		return "", e.problem("reads blocks %v of request %q that the prefill freed when the decode refused it", x.blocks, key)
	}
	if !reflect.DeepEqual(p["remote_block_ids"], x.blocks) || x.prompt != l.prompt {
		return "", e.problem("pulled blocks %v of %q for %q; the prefill exported %v", p["remote_block_ids"], x.prompt, l.prompt, x.blocks)
	}
	for k, v := range x.response {
		if k != "do_remote_prefill" && k != "do_remote_decode" && !reflect.DeepEqual(p[k], v) {
			return "", e.problem("%s is %v, the prefill answered %v", k, p[k], v)
		}
	}
	x.imported = true
	return outcomeImported, ""
}

// mooncakeModel is MooncakeConnector (and omnipd's reference connector in
// push mode): both legs rendezvous on transfer_id; the prefill answers null.
type mooncakeModel struct{}

func (mooncakeModel) prefill(e *vllmEngine, l engineLeg) (map[string]any, string) {
	if !flagOf(l.params, "do_remote_decode") {
		return nil, e.problem("kv_transfer_params %v do not ask for a remote decode", l.params)
	}
	id, _ := l.params["transfer_id"].(string)
	if id == "" {
		return nil, e.problem("KeyError: 'transfer_id' in %v", l.params)
	}
	e.fabric.export(id, kvExport{prompt: l.prompt, internalID: l.internalID})
	return nil, ""
}

func (mooncakeModel) decode(e *vllmEngine, l engineLeg) (string, string) {
	p := l.params
	if !flagOf(p, "do_remote_prefill") {
		return outcomeRecomputed, ""
	}
	for _, k := range []string{"transfer_id", "remote_engine_id", "remote_bootstrap_addr"} {
		if s, _ := p[k].(string); s == "" {
			return "", e.problem("KeyError: %q in kv_transfer_params %v", k, p)
		}
	}
	if want := "http://" + sideChannel(e.other); p["remote_bootstrap_addr"] != want {
		return "", e.problem("bootstrap query %v/query: nothing listens there (the prefill's bootstrap server is %s)", p["remote_bootstrap_addr"], want)
	}
	if p["remote_engine_id"] != e.other.EngineID {
		return "", e.problem("the bootstrap server knows no engine %v (it serves %q)", p["remote_engine_id"], e.other.EngineID)
	}
	id := p["transfer_id"].(string)
	x := e.fabric.await(l.ctx, id, awaitBound)
	if x == nil {
		return "", e.problem("would hang: waits for transfer %q that no prefill exports", id)
	}
	if x.freed {
		return "", e.problem("would hang: waits for transfer %q that the prefill released when the decode refused it", id)
	}
	if x.prompt != l.prompt {
		return "", e.problem("transfer %q carries the KV of %q, not %q", id, x.prompt, l.prompt)
	}
	x.imported = true
	return outcomeImported, ""
}

// The regular expressions of P2pNcclEngine.parse_request_id.
var (
	p2pDecodeAddr  = regexp.MustCompile(`___decode_addr_(.*):(\d+)`)
	p2pPrefillAddr = regexp.MustCompile(`___prefill_addr_(.*):(\d+)___`)
)

// p2pNcclModel is P2pNcclConnector in PUT_ASYNC mode.
type p2pNcclModel struct{}

func (p2pNcclModel) prefill(e *vllmEngine, l engineLeg) (map[string]any, string) {
	m := p2pDecodeAddr.FindStringSubmatch(l.internalID)
	if m == nil {
		return nil, e.problem("ValueError: Request id %s does not contain hostname and port", l.internalID)
	}
	if got := m[1] + ":" + m[2]; got != sideChannel(e.other) {
		for _, d := range e.down {
			if got == sideChannel(d) {
				return nil, "" // the send fails on the engine's side; the answer is the same
			}
		}
		return nil, e.problem("sends the KV to %s, the decode listens at %s", got, sideChannel(e.other))
	}
	e.fabric.export(l.internalID, kvExport{prompt: l.prompt, internalID: l.internalID})
	return nil, ""
}

func (p2pNcclModel) decode(e *vllmEngine, l engineLeg) (string, string) {
	// The consumer claims every prompt and waits for its tensors under its
	// own request id, whatever the request carries.
	if m := p2pPrefillAddr.FindStringSubmatch(l.internalID); m != nil && m[1]+":"+m[2] != sideChannel(e.other) {
		return "", e.problem("request id names the prefill %s:%s, it is at %s", m[1], m[2], sideChannel(e.other))
	}
	x := e.fabric.lookup(l.internalID)
	if x == nil {
		return "", e.problem("would hang: the consumer claims the prompt and waits for KV under %q that no prefill sent", l.internalID)
	}
	if x.prompt != l.prompt {
		return "", e.problem("received the KV of %q for %q", x.prompt, l.prompt)
	}
	x.imported = true
	return outcomeImported, ""
}

// lmcacheModel is LMCacheConnectorV1: storage mode (a shared store found by
// content) or PD mode (the prefiller pushes to the decoder its disagg_spec
// names).
type lmcacheModel struct{ pd bool }

func (m lmcacheModel) prefill(e *vllmEngine, l engineLeg) (map[string]any, string) {
	if !m.pd {
		e.fabric.export("content:"+l.prompt, kvExport{prompt: l.prompt})
		return nil, ""
	}
	spec, _ := l.params["disagg_spec"].(map[string]any)
	if spec == nil {
		// Nothing says where to push: the KV stays with the prefiller and
		// the decoder will recompute the prompt.
		return nil, ""
	}
	if spec["receiver_host"] != e.other.KVHost {
		return nil, e.problem("disagg_spec receiver_host %v, the decoder is at %s", spec["receiver_host"], e.other.KVHost)
	}
	reqID, _ := spec["req_id"].(string)
	if reqID == "" || e.notices == nil {
		return nil, e.problem("disagg_spec req_id %v: no done notice could reach the router", spec["req_id"])
	}
	// LMCache's default PD backend (pd_backend_mode async) writes the KV
	// after the step that answers the request: the receiver has the room
	// registered (the key is visible) but not the data until the sender's
	// write ends, after which it pushes one notice per receiver TP rank.
	key := "content:" + l.prompt
	e.fabric.mu.Lock()
	e.fabric.entry(key)
	e.fabric.mu.Unlock()
	go func() {
		// The write ends at a time of its own after the answer: here, once
		// the router waits for the notices, or once a decode leg came to
		// read the KV too early — whichever comes first.
		<-l.ctx.Done()
		e.notices.landing(reqID, key)
		e.fabric.export(key, kvExport{prompt: l.prompt})
		for range max(e.other.TP, 1) {
			e.notices.Done(reqID)
		}
	}()
	return map[string]any{"first_tok": 1}, ""
}

func (m lmcacheModel) decode(e *vllmEngine, l engineLeg) (string, string) {
	key := "content:" + l.prompt
	x := e.fabric.lookup(key)
	if x == nil {
		e.fabric.mu.Lock()
		_, pending := e.fabric.exports[key]
		e.fabric.mu.Unlock()
		if m.pd && pending {
			e.notices.early(key)
			return "", e.problem("decode sent before the sender's done notice: the receiver reads KV still being written")
		}
		return outcomeRecomputed, ""
	}
	x.imported = true
	return outcomeImported, ""
}

// moriioModel is MoRIIOConnector in read mode.
type moriioModel struct{}

func (moriioModel) prefill(e *vllmEngine, l engineLeg) (map[string]any, string) {
	if !flagOf(l.params, "do_remote_decode") {
		return nil, e.problem("no do_remote_decode in %v", l.params)
	}
	id, _ := l.params["transfer_id"].(string)
	if id == "" {
		return nil, e.problem("KeyError: 'transfer_id' in %v", l.params)
	}
	e.mu.Lock()
	e.n++
	n := e.n
	e.mu.Unlock()
	resp := map[string]any{
		"do_remote_prefill": true, "do_remote_decode": false,
		"remote_block_ids": []int{n * 10, n*10 + 1}, "remote_engine_id": sideChannel(e.peer),
		"remote_host": e.peer.KVHost, "remote_handshake_port": e.peer.KVPort, "remote_notify_port": 61005,
		"remote_dp_size": 1, "tp_size": 1, "transfer_id": id,
	}
	raw, _ := json.Marshal(resp)
	var decoded map[string]any
	_ = json.Unmarshal(raw, &decoded)
	e.fabric.export(id, kvExport{prompt: l.prompt, internalID: l.internalID, blocks: decoded["remote_block_ids"], response: decoded})
	return resp, ""
}

func (moriioModel) decode(e *vllmEngine, l engineLeg) (string, string) {
	p := l.params
	if !flagOf(p, "do_remote_prefill") {
		// moriio_connector.py @6fbdff48, get_num_new_matched_tokens: a
		// consumer counts len(prompt) - 1 tokens as external for every
		// request, and update_state_after_alloc loads nothing without
		// params: the decode computes on blocks it never filled.
		return "", e.problem("would compute on KV never loaded: the consumer claims every prompt's KV, and no prefill made it")
	}
	for _, k := range []string{"remote_block_ids", "remote_engine_id", "transfer_id"} {
		if _, ok := p[k]; !ok {
			return "", e.problem("KeyError: %q in %v", k, p)
		}
	}
	if p["remote_engine_id"] != sideChannel(e.other) {
		return "", e.problem("remote_engine_id %v, the prefill is %s", p["remote_engine_id"], sideChannel(e.other))
	}
	id, _ := p["transfer_id"].(string)
	x := e.fabric.lookup(id)
	if x == nil {
		return "", e.problem("KV read failed: no blocks exported under transfer_id %q", id)
	}
	if !reflect.DeepEqual(p["remote_block_ids"], x.blocks) || x.prompt != l.prompt {
		return "", e.problem("read blocks %v of %q for %q", p["remote_block_ids"], x.prompt, l.prompt)
	}
	if x.internalID != l.internalID {
		return "", e.problem("request id %q, the prefill's was %q: the completion notice is lost and the prefill keeps the blocks", l.internalID, x.internalID)
	}
	x.imported = true
	return outcomeImported, ""
}

// noticeBoard is the router's kvnotice.Board, which also tells the fake
// sender when the router starts waiting, so that whether the decode leg
// waited for the KV does not depend on goroutine timing.
type noticeBoard struct {
	kvnotice.Board
	mu      sync.Mutex
	signals map[string]chan struct{} // by req_id and by content key
}

func (b *noticeBoard) signal(key string) chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.signals == nil {
		b.signals = map[string]chan struct{}{}
	}
	ch, ok := b.signals[key]
	if !ok {
		ch = make(chan struct{})
		b.signals[key] = ch
	}
	return ch
}

func (b *noticeBoard) fire(key string) {
	ch := b.signal(key)
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-ch:
	default:
		close(ch)
	}
}

func (b *noticeBoard) Await(ctx context.Context, key string, n int) error {
	b.fire(key)
	return b.Board.Await(ctx, key, n)
}

// landing blocks the sender's write until the router waits for reqID or a
// decode came early for contentKey.
func (b *noticeBoard) landing(reqID, contentKey string) {
	select {
	case <-b.signal(reqID):
	case <-b.signal(contentKey):
	}
}

func (b *noticeBoard) early(contentKey string) { b.fire(contentKey) }

// enginePool serves h (e, or a wrapper of it) on loopback and makes it a
// one-instance pool whose peer is e's, at the server's address.
func enginePool(t testing.TB, e *vllmEngine, name string, h http.Handler) *Pool {
	t.Helper()
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	cl, err := stageclient.New(stageclient.Config{BaseURL: hs.URL})
	if err != nil {
		t.Fatal(err)
	}
	e.peer.HTTPAddr = strings.TrimPrefix(hs.URL, "http://")
	return &Pool{Name: name, Instances: []*Instance{{Client: cl, Peer: e.peer}}}
}
