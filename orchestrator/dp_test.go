package orchestrator

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/stageclient"
)

// dpNixl is the KV data path between a data-parallel NIXL prefill instance
// and a data-parallel decode instance, each one `vllm serve
// --data-parallel-size n` with one API server. The API server runs a leg on
// the rank X-data-parallel-rank names (vllm/entrypoints/openai/engine/
// serving.py _get_data_parallel_rank; without it, its own balancer
// picks); prefill rank k is KV engine "<engine_id>_dp<k>"
// (vllm/v1/engine/core.py run_engine_core) with its side channel at
// VLLM_NIXL_SIDE_CHANNEL_PORT + k (nixl/base_scheduler.py), and answers
// both (nixl/pull_scheduler.py request_finished). A decode, on any of its
// ranks, pulls from the engine at the side channel it is given.
type dpNixl struct {
	prefill, decode kvconnector.Peer

	mu       sync.Mutex
	exports  map[string]string // "<engine id>/<remote_request_id>" -> prompt
	ranks    map[string][]int  // leg ("prefill", "decode") -> ranks it ran on
	problems []string
	n        int
}

func (f *dpNixl) problem(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.problems = append(f.problems, fmt.Sprintf(format, args...))
}

// rank is the rank the API server runs r on, or -1 (recorded) when the
// router left the choice to the engine.
func (f *dpNixl) rank(r *http.Request, leg string, n int) int {
	h := r.Header.Get("X-data-parallel-rank")
	k, err := strconv.Atoi(h)
	if err != nil || k < 0 || k >= n {
		f.problem("%s leg: X-data-parallel-rank %q; the instance runs ranks 0-%d and the router cannot know where this leg ran", leg, h, n-1)
		return -1
	}
	f.mu.Lock()
	f.ranks[leg] = append(f.ranks[leg], k)
	f.mu.Unlock()
	return k
}

func (f *dpNixl) serve(leg string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
			KV map[string]any `json:"kv_transfer_params"`
		}
		raw, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(raw, &body); err != nil || len(body.Messages) == 0 {
			http.Error(w, "bad request", 400)
			return
		}
		prompt := body.Messages[0].Content
		w.Header().Set("Content-Type", "application/json")
		if leg == "prefill" {
			k := f.rank(r, leg, f.prefill.DataParallel())
			if k < 0 {
				k = 0
			}
			f.mu.Lock()
			f.n++
			internal := fmt.Sprintf("%s-%08x", r.Header.Get("X-Request-Id"), f.n)
			engine := fmt.Sprintf("%s_dp%d", f.prefill.EngineID, k)
			f.exports[engine+"/"+internal] = prompt
			f.mu.Unlock()
			_ = json.NewEncoder(w).Encode(map[string]any{
				"id": "p", "object": "chat.completion",
				"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": "a"}, "finish_reason": "length"}},
				"kv_transfer_params": map[string]any{
					"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": [][]int{{1, 2}},
					"remote_engine_id": engine, "remote_request_id": internal,
					"remote_host": f.prefill.KVHost, "remote_port": f.prefill.KVPort + k, "tp_size": 1, "remote_num_tokens": 3,
				},
			})
			return
		}
		f.rank(r, leg, f.decode.DataParallel())
		p := body.KV
		port, _ := p["remote_port"].(float64)
		k := int(port) - f.prefill.KVPort
		engine, _ := p["remote_engine_id"].(string)
		id, _ := p["remote_request_id"].(string)
		answer := "recomputed"
		switch {
		case k < 0 || k >= f.prefill.DataParallel():
			f.problem("decode: side channel port %v: no prefill rank listens there", p["remote_port"])
		case engine != fmt.Sprintf("%s_dp%d", f.prefill.EngineID, k):
			f.problem("decode: handshake with engine %q at rank %d's side channel: engine id mismatch", engine, k)
		default:
			f.mu.Lock()
			got, ok := f.exports[engine+"/"+id]
			delete(f.exports, engine+"/"+id)
			f.mu.Unlock()
			if !ok || got != prompt {
				f.problem("decode: engine %s has no KV of %q under %q", engine, prompt, id)
			} else {
				answer = "pulled"
			}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": "d", "object": "chat.completion",
			"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": answer}, "finish_reason": "stop"}},
		})
	})
}

// A DP=2 NIXL prefill and decode: every leg is pinned to a rank, the
// ranks of each instance are used in turn, and each decode finds its KV on
// the rank its prefill ran on.
func TestDataParallelNixl(t *testing.T) {
	f := &dpNixl{
		prefill: kvconnector.Peer{EngineID: "p0", KVHost: "127.0.0.1", KVPort: 5600, TP: 1, DP: 2},
		decode:  kvconnector.Peer{EngineID: "d0", KVHost: "127.0.0.1", KVPort: 5700, TP: 1, DP: 2},
		exports: map[string]string{}, ranks: map[string][]int{},
	}
	mk := func(name string, h http.Handler, peer kvconnector.Peer) *Pool {
		hs := httptest.NewServer(h)
		t.Cleanup(hs.Close)
		c, err := stageclient.New(stageclient.Config{BaseURL: hs.URL})
		if err != nil {
			t.Fatal(err)
		}
		return &Pool{Name: name, Instances: []*Instance{{Client: c, Peer: peer}}}
	}
	contract, err := kvconnector.NewRegistry().Lookup(kvconnector.NixlConnector, nil)
	if err != nil {
		t.Fatal(err)
	}
	o, err := New(Config{Prefill: mk("prefill", f.serve("prefill"), f.prefill), Decode: mk("decode", f.serve("decode"), f.decode),
		Contract: contract, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		req := chatRequest(t, fmt.Sprintf("req-%d", i), fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"prompt %d"}],"max_tokens":4}`, i))
		res, err := o.Do(t.Context(), req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		text, err := answerText(t, res)
		res.Close()
		if err != nil || text != "pulled" {
			t.Errorf("request %d: the decode answered %q (%v); want the KV pulled from the prefill's rank", i, text, err)
		}
	}
	for _, p := range f.problems {
		t.Error(p)
	}
	for _, leg := range []string{"prefill", "decode"} {
		if got := f.ranks[leg]; fmt.Sprint(got) != "[0 1 0 1]" {
			t.Errorf("%s legs ran on ranks %v; want each rank in turn, [0 1 0 1]", leg, got)
		}
	}
	if len(f.exports) != 0 {
		t.Errorf("KV never pulled: %v", f.exports)
	}
}
