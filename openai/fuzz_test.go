package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

// FuzzDecodeChatRequest pins that no body crashes the decoder (invariant 6:
// bad input never crashes a process), that every rejection is a
// *RequestError, and that what it accepts survives being forwarded: encoding
// an accepted request and decoding it again succeeds and is a fixed point.
func FuzzDecodeChatRequest(f *testing.F) {
	seeds := []string{
		`{"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"user","content":"x"}],"stop":"s","kv_transfer_params":{"a":[1,{"b":null}]},"modalities":["audio"],"audio":{"format":"wav"},"extra":[1e300,-0,"\u0000"]}`,
		`{"messages":[{"role":"user","content":"x"}],"max_tokens":1,"max_completion_tokens":2,"min_tokens":1,"temperature":0,"top_p":1,"n":1,"seed":-1}`,
		`{"messages":[{"role":"user","content":null,"name":"n"}],"Messages":1}`,
		`{"messages":[{"role":"user","content":[{"text":"no type"}]}]}`,
		`{"messages":[]}`, `[]`, `null`, `{`, `{"messages":[{"role":"user"}]} {}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := DecodeChatRequest(bytes.NewReader(body), 1<<20)
		if err != nil {
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("error %v is %T, want *RequestError", err, err)
			}
			return
		}
		first, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("Marshal of an accepted request: %v\nbody %q", err, body)
		}
		again, err := DecodeChatRequest(bytes.NewReader(first), 1<<20)
		if err != nil {
			t.Fatalf("re-decoding our own output: %v\nbody   %q\noutput %s", err, body, first)
		}
		second, err := json.Marshal(again)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(first, second) {
			t.Fatalf("not a fixed point:\nfirst  %s\nsecond %s", first, second)
		}
		if clone, _ := json.Marshal(req.Clone()); !bytes.Equal(clone, first) {
			t.Fatalf("clone differs:\nclone %s\norig  %s", clone, first)
		}
	})
}

// FuzzDecodeCompletionRequest is the same property for completions, whose
// prompt has four shapes.
func FuzzDecodeCompletionRequest(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"hi"}`, `{"prompt":["a","b"],"n":2}`, `{"prompt":[1,2,3],"logprobs":1}`,
		`{"prompt":[[1],[2,3]],"stop":["x"],"echo":true}`, `{"prompt_embeds":"AA=="}`,
		`{"prompt":[]}`, `{"prompt":[[]]}`, `{"prompt":[1,"a"]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := DecodeCompletionRequest(bytes.NewReader(body), 1<<20)
		if err != nil {
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("error %v is %T, want *RequestError", err, err)
			}
			return
		}
		first, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("Marshal of an accepted request: %v\nbody %q", err, body)
		}
		again, err := DecodeCompletionRequest(bytes.NewReader(first), 1<<20)
		if err != nil {
			t.Fatalf("re-decoding our own output: %v\nbody   %q\noutput %s", err, body, first)
		}
		if second, _ := json.Marshal(again); !bytes.Equal(first, second) {
			t.Fatalf("not a fixed point:\nfirst  %s\nsecond %s", first, second)
		}
	})
}
