package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

// endpoint is one request decoder the fuzz target drives.
type endpoint struct {
	name  string
	seeds []string
	// decode decodes a body; clone is the decoded request's Clone.
	decode func(body []byte) (req any, clone func() any, err error)
}

var endpoints = []endpoint{
	{
		name: "chat",
		seeds: []string{
			`{"messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}],"stream":true,"stream_options":{"include_usage":true}}`,
			`{"messages":[{"role":"user","content":"x"}],"stop":"s","kv_transfer_params":{"a":[1,{"b":null}]},"modalities":["audio"],"audio":{"format":"wav"},"extra":[1e300,-0,"\u0000"]}`,
			`{"messages":[{"role":"user","content":"x"}],"max_tokens":1,"max_completion_tokens":2,"min_tokens":1,"temperature":0,"top_p":1,"n":1,"seed":-1}`,
			`{"messages":[{"role":"user","content":null,"name":"n"}],"Messages":1}`,
			`{"messages":[{"role":"user","content":[{"text":"no type"}]}]}`,
			`{"messages":[]}`, `[]`, `null`, `{`, `{"messages":[{"role":"user"}]} {}`,
		},
		decode: func(body []byte) (any, func() any, error) {
			req, err := DecodeChatRequest(bytes.NewReader(body), 1<<20)
			if err != nil {
				return nil, nil, err
			}
			return req, func() any { return req.Clone() }, nil
		},
	},
	{
		name: "completions",
		seeds: []string{
			`{"prompt":"hi"}`, `{"prompt":["a","b"],"n":2}`, `{"prompt":[1,2,3],"logprobs":1}`,
			`{"prompt":[[1],[2,3]],"stop":["x"],"echo":true}`, `{"prompt_embeds":"AA=="}`,
			`{"prompt":[]}`, `{"prompt":[[]]}`, `{"prompt":[1,"a"]}`,
		},
		decode: func(body []byte) (any, func() any, error) {
			req, err := DecodeCompletionRequest(bytes.NewReader(body), 1<<20)
			if err != nil {
				return nil, nil, err
			}
			return req, func() any { return req.Clone() }, nil
		},
	},
}

// FuzzDecodeRequest drives the request decoder of every endpoint (chat
// completions and completions; which picks one) with the same properties:
// no body crashes it (invariant 6: bad input never crashes a process), every
// rejection is a *RequestError, and what it accepts survives being
// forwarded — encoding an accepted request and decoding it again succeeds
// and is a fixed point, and a clone encodes the same.
func FuzzDecodeRequest(f *testing.F) {
	for i, e := range endpoints {
		for _, s := range e.seeds {
			f.Add(uint8(i), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		e := endpoints[int(which)%len(endpoints)]
		req, clone, err := e.decode(body)
		if err != nil {
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("%s: error %v is %T, want *RequestError", e.name, err, err)
			}
			return
		}
		first, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("%s: Marshal of an accepted request: %v\nbody %q", e.name, err, body)
		}
		again, _, err := e.decode(first)
		if err != nil {
			t.Fatalf("%s: re-decoding our own output: %v\nbody   %q\noutput %s", e.name, err, body, first)
		}
		second, err := json.Marshal(again)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(first, second) {
			t.Fatalf("%s: not a fixed point:\nfirst  %s\nsecond %s", e.name, first, second)
		}
		if c, _ := json.Marshal(clone()); !bytes.Equal(c, first) {
			t.Fatalf("%s: clone differs:\nclone %s\norig  %s", e.name, c, first)
		}
	})
}
