package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/reference/engine/talker"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
	"github.com/omnipd/omnipd/stageapi"
)

// A Talker request with a bad parameter is a 400 with OpenAI's error body
// naming it, before the Talker fetches anything: the stash the request
// names is still on the Thinker, and the corrected request reads it —
// batch and async chunk alike.
func TestTalkerRefusesBadParamsBeforeFetching(t *testing.T) {
	thinker := newTestWorker(t, "")
	tk := httptest.NewServer(NewTalker(talker.Default(), talker.DefaultSegmenter(), testSecret, quietLog()))
	t.Cleanup(tk.Close)
	prompt := testTokenizer.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: "Hello!"}}, true)

	for _, c := range []struct {
		name, fields, param string
	}{
		{"negative max_frames", `"max_frames": -1`, "max_frames"},
		{"max_frames past the limit", fmt.Sprintf(`"max_frames": %d`, maxTalkerFrames+1), "max_frames"},
		// The Talker reserves its cache for max_frames up front: a count
		// past any memory would end the process, not the request.
		{"max_frames past any memory", `"max_frames": 1099511627776`, "max_frames"},
		{"max_frames no integer", `"max_frames": "4"`, "max_frames"},
		{"negative temperature", `"temperature": -0.5`, "temperature"},
		{"temperature past float64", `"temperature": 1e400`, "temperature"},
		{"negative top_k", `"top_k": -1`, "top_k"},
		{"top_k no integer", `"top_k": 2.5`, "top_k"},
		{"seed a string", `"seed": "42"`, "seed"},
		{"seed no integer", `"seed": 1.5`, "seed"},
		{"seed past int64", `"seed": 9223372036854775808`, "seed"},
	} {
		for _, async := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/async_chunk=%v", c.name, async), func(t *testing.T) {
				key := fmt.Sprintf("params/%s/%v", c.name, async)
				keep := body(prompt, 4, 0, 0)
				keep["omnipd_conditioning"] = map[string]any{"key": key, "layer": 2}
				if _, _, err := post(context.Background(), thinker.url, key, keep); err != nil {
					t.Fatal(err)
				}
				handle := []stageapi.ConditioningHandle{{URL: thinker.url, Key: key}}
				handleJSON, _ := json.Marshal(handle)
				req := fmt.Sprintf(`{"conditioning": %s, "async_chunk": %v, %s}`, handleJSON, async, c.fields)
				status, _, b := call(t, "POST", tk.URL+stageapi.TalkerPath, "Bearer "+testSecret, req)
				var e openai.ErrorResponse
				if status != http.StatusBadRequest || json.Unmarshal([]byte(b), &e) != nil || e.Detail.Param == nil || *e.Detail.Param != c.param {
					t.Errorf("%s: HTTP %d %.300s; want 400 with OpenAI's error body naming %q", req, status, b, c.param)
				} else if !strings.Contains(e.Detail.Message, c.param) {
					t.Errorf("%s: message %q does not name %s", req, e.Detail.Message, c.param)
				}
				if n := thinker.Stashes(); n != 1 {
					t.Fatalf("%s: the Thinker holds %d stashes after the refusal; want the 1 the request named", req, n)
				}
				// Every value in range is taken, a negative seed among them.
				frames := readFrames(t, tk.URL, stageapi.TalkerRequest{Conditioning: handle, AsyncChunk: async,
					Temperature: 0.9, TopK: 50, Seed: new(int64(-7)), MaxFrames: 2})
				if len(frames) != 2 {
					t.Errorf("the corrected request: %d frames; want max_frames 2", len(frames))
				}
				if n := thinker.Stashes(); n != 0 {
					t.Errorf("the Thinker holds %d stashes after the Talker read its one", n)
				}
			})
		}
	}
}

// The done event carries the count of frames sent even when it is 0 (a
// Talker that stops before its first frame), and a frame event carries
// only its frame: the stream's wire form, as the handler writes it.
func TestTalkerEventsOnTheWire(t *testing.T) {
	for _, c := range []struct {
		ev   stageapi.TalkerEvent
		want string
	}{
		{stageapi.TalkerEvent{Done: true}, `{"done":true,"frames":0}`},
		{stageapi.TalkerEvent{Done: true, Frames: 34}, `{"done":true,"frames":34}`},
		{stageapi.TalkerEvent{Frame: []int{1021, 17}}, `{"frame":[1021,17]}`},
		{stageapi.TalkerEvent{Error: "conditioning <lost> & gone"}, `{"error":"conditioning <lost> & gone"}`},
	} {
		rec := httptest.NewRecorder()
		if err := openai.NewSSEWriter(rec).WriteEvent(c.ev); err != nil {
			t.Fatal(err)
		}
		if got, want := rec.Body.String(), "data: "+c.want+"\n\n"; got != want {
			t.Errorf("%+v: %q; want %q", c.ev, got, want)
		}
	}
}
