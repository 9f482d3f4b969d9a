package orchestrator

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/metrics"
)

// llmdSimPrefillAnswer answers a prefill the way llm-d's inference
// simulator and vLLM's NixlConnector before remote_request_id do: the
// decode finds the KV under its own request id.
func llmdSimPrefillAnswer(w http.ResponseWriter, _ map[string]any) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"length"}],
		"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"p0","remote_block_ids":[1,2],
		"remote_host":"127.0.0.1","remote_port":5600,"tp_size":1}}`)
}

// A NIXL prefill without remote_request_id is handed to the decode, under
// the same X-Request-Id as the prefill leg (the key such a decode uses),
// and counted.
func TestNixlHandoffWithoutRemoteRequestID(t *testing.T) {
	pre := &fakeStage{answer: llmdSimPrefillAnswer}
	dec := &fakeStage{answer: decodeAnswer}
	o := newOrch(t, pre, dec, "NixlConnector")
	m := metrics.NewOrchestrator()
	o.cfg.Metrics = m
	res, err := o.Do(context.Background(), chatRequest(t, "r-7", `{"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatalf("Do: %v; a prefill without remote_request_id was refused", err)
	}
	res.Close()
	body, did := dec.last()
	_, pid := pre.last()
	if body == nil {
		t.Fatal("no decode was sent")
	}
	if did != pid {
		t.Errorf("decode X-Request-Id %q, prefill %q: such a decode finds the KV under its own id", did, pid)
	}
	kv, _ := body["kv_transfer_params"].(map[string]any)
	if kv["do_remote_prefill"] != true || kv["remote_engine_id"] != "p0" || kv["tp_size"] != 1.0 {
		t.Errorf("decode kv_transfer_params = %v", kv)
	}
	if _, ok := kv["remote_request_id"]; ok {
		t.Errorf("omnipd invented a remote_request_id: %v", kv)
	}
	want := `omnipd_kv_handoff_without_key_total{connector="NixlConnector",key="remote_request_id"} 1`
	if text := scrapeMetrics(t, m); !strings.Contains(text, want) {
		t.Errorf("metrics lack %s", want)
	}

	// A full vLLM answer is not counted.
	o2 := newOrch(t, &fakeStage{answer: nixlPrefillAnswer}, &fakeStage{answer: decodeAnswer}, "NixlConnector")
	m2 := metrics.NewOrchestrator()
	o2.cfg.Metrics = m2
	res, err = o2.Do(context.Background(), chatRequest(t, "r-8", `{"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Close()
	if text := scrapeMetrics(t, m2); strings.Contains(text, `omnipd_kv_handoff_without_key_total{`) {
		t.Errorf("a handoff with remote_request_id was counted as one without")
	}
}
