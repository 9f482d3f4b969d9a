package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/omnipd/omnipd/internal/testbed"
)

// relayedChoice is the part of a choice, whole or streamed, these tests read.
type relayedChoice struct {
	Index        int             `json:"index"`
	FinishReason *string         `json:"finish_reason"`
	Message      json.RawMessage `json:"message"`
	Delta        json.RawMessage `json:"delta"`
}

type relayedDoc struct {
	ID       string          `json:"id"`
	Modality string          `json:"modality"`
	Choices  []relayedChoice `json:"choices"`
}

// clientView fails t unless doc carries the id the client named its
// request by and nothing of the protocol between omnipd and its stages.
func clientView(t *testing.T, what string, doc []byte, wantID string) relayedDoc {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(doc, &m); err != nil {
		t.Fatalf("%s: %v: %.300s", what, err, doc)
	}
	for _, internal := range []string{"kv_transfer_params", "omnipd_conditioning"} {
		if _, ok := m[internal]; ok {
			t.Errorf("%s carries %s: %.300s", what, internal, doc)
		}
	}
	var d relayedDoc
	_ = json.Unmarshal(doc, &d)
	if d.ID != wantID {
		t.Errorf("%s: id %q, want %q, the client's X-Request-Id as vLLM names an answer", what, d.ID, wantID)
	}
	return d
}

// One finish_reason rule for whole and streamed omni answers, vllm-omni's:
// the text choice ends with the Thinker's own reason (here "length": the
// output is capped), the audio choice with "stop"; streamed, each modality's
// last chunk carries its reason and no chunk before it does. Every answer
// and chunk carries the client's X-Request-Id and no stage-protocol member.
func TestOmniFinishReasonsAgree(t *testing.T) {
	d := testbed.Start(t, testbed.Options{Omni: true})
	ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
	defer cancel()
	const clientID = "finish-rule-1"
	body := func(stream bool) string {
		return chatBody("Tell me about the sea", 3, stream, `"seed":7,"temperature":0`)
	}

	whole := send(ctx, d, chatPath, body(false), "X-Request-Id", clientID)
	if whole.err != nil || whole.status != http.StatusOK {
		t.Fatalf("whole answer: %v", whole)
	}
	w := clientView(t, "whole answer", whole.body, "chatcmpl-"+clientID)
	if len(w.Choices) != 2 || w.Choices[0].FinishReason == nil || w.Choices[1].FinishReason == nil {
		t.Fatalf("whole answer: want a text and an audio choice, each with a finish_reason: %.400s", whole.body)
	}
	textReason, audioReason := *w.Choices[0].FinishReason, *w.Choices[1].FinishReason
	if textReason != "length" || audioReason != "stop" {
		t.Errorf("whole answer: finish reasons text %q audio %q, want length and stop", textReason, audioReason)
	}

	streamed := send(ctx, d, chatPath, body(true), "X-Request-Id", clientID)
	if streamed.err != nil || streamed.status != http.StatusOK || !streamed.done {
		t.Fatalf("streamed answer: %v", streamed)
	}
	last := map[string]int{}      // modality → index of its last chunk with a choice
	reasons := map[string][]int{} // modality → indexes of chunks with a finish_reason
	for i, ev := range streamed.events {
		c := clientView(t, "chunk", ev, "chatcmpl-"+clientID)
		if len(c.Choices) == 0 {
			continue
		}
		last[c.Modality] = i
		if c.Choices[0].FinishReason != nil {
			reasons[c.Modality] = append(reasons[c.Modality], i)
		}
	}
	for modality, want := range map[string]string{"text": textReason, "audio": audioReason} {
		idx := reasons[modality]
		if len(idx) != 1 || idx[0] != last[modality] {
			t.Errorf("%s: finish_reason on chunks %v, want exactly its last chunk (%d)", modality, idx, last[modality])
			continue
		}
		if got := *parseRelayed(streamed.events[idx[0]]).Choices[0].FinishReason; got != want {
			t.Errorf("%s: streamed finish_reason %q, whole answer says %q", modality, got, want)
		}
	}
}

func parseRelayed(ev json.RawMessage) relayedDoc {
	var d relayedDoc
	_ = json.Unmarshal(ev, &d)
	return d
}
