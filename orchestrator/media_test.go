package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
)

// Media parts and mm_processor_kwargs reach a vLLM stage's every Thinker
// leg — prefill and decode, as vLLM's disaggregated proxies send the
// original request to both — exactly as the client sent them: vLLM fetches
// and processes them under its own flags.
func TestMediaPartsReachVLLMStagesUnchanged(t *testing.T) {
	const messages = `[{"role":"user","content":[
		{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}},
		{"type":"image_url","image_url":{"url":"https://example.com/cat.png","detail":"high"}},
		{"type":"video_url","video_url":{"url":"data:video/mp4;base64,AAAA"}},
		{"type":"audio_url","audio_url":{"url":"file:///media/a.wav"}},
		{"type":"text","text":"What is in these?"}]}]`
	const kwargs = `{"use_audio_in_video":true,"fps":2}`
	var want struct {
		Messages []any          `json:"messages"`
		Kwargs   map[string]any `json:"mm_processor_kwargs"`
	}
	body := fmt.Sprintf(`{"model":"m","messages":%s,"mm_processor_kwargs":%s}`, messages, kwargs)
	if err := json.Unmarshal([]byte(body), &want); err != nil {
		t.Fatal(err)
	}
	for _, pd := range []bool{false, true} {
		pre, dec := &fakeStage{answer: toolStage}, &fakeStage{answer: toolStage}
		o := newOrch(t, pre, dec, "NixlConnector")
		if !pd {
			o.cfg.Contract = nil
		}
		res, err := o.Do(context.Background(), chatRequest(t, fmt.Sprintf("r-media-%v", pd), body))
		if err != nil {
			t.Fatal(err)
		}
		res.Close()
		legs := map[string]*fakeStage{"decode": dec}
		if pd {
			legs["prefill"] = pre
		}
		for name, leg := range legs {
			got, _ := leg.last()
			if !reflect.DeepEqual(got["messages"], want.Messages) || !reflect.DeepEqual(got["mm_processor_kwargs"], want.Kwargs) {
				t.Errorf("pd %v, %s leg got messages %v and mm_processor_kwargs %v; want the client's", pd, name, got["messages"], got["mm_processor_kwargs"])
			}
		}
	}
}
