package stagetest

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/stageapi"
)

// repeatPrompt repeats words, so that the prompt holds one token more than
// once and the layer-0 rows of equal tokens can be compared.
const repeatPrompt = "echo echo echo, said the echo to the echo."

// wantHandle checks the response's conditioning handle: the key asked for
// and rows.
func (c *checker) wantHandle(what string, r *completion, key string, rows int) {
	c.Helper()
	switch {
	case r.Conditioning == nil:
		c.Errorf("%s: the answer carries no omnipd_conditioning handle", what)
	case r.Conditioning.Key != key:
		c.Errorf("%s: handle key %q; want %q", what, r.Conditioning.Key, key)
	case r.Conditioning.Rows == nil:
		c.Errorf("%s: the handle has no rows", what)
	case *r.Conditioning.Rows != rows:
		c.Errorf("%s: handle rows %d; want %d", what, *r.Conditioning.Rows, rows)
	}
}

// wantStashShape checks what a decoded stash must be whatever the engine:
// rows rows of one width each, TTS embeddings as wide as the word
// embeddings, and the token ids of the request.
func (c *checker) wantStashShape(what string, st *stageapi.Conditioning, rows, tokens int, prompt []int) {
	c.Helper()
	if len(st.Embed) != rows || len(st.Hidden) != rows {
		c.Errorf("%s: %d embed and %d hidden rows; want %d", what, len(st.Embed), len(st.Hidden), rows)
	}
	if rows > 0 && (len(st.Embed) == 0 || len(st.Embed[0]) == 0 || len(st.Hidden) == 0 || len(st.Hidden[0]) == 0) {
		c.Errorf("%s: rows of width 0", what)
	}
	if len(st.Embed) > 0 && len(st.TTSPad) != len(st.Embed[0]) {
		c.Errorf("%s: TTS embeddings of width %d; the word embeddings are %d wide (the TTS rows are word embeddings)", what, len(st.TTSPad), len(st.Embed[0]))
	}
	if vecEqual(st.TTSPad, st.TTSBos) || vecEqual(st.TTSBos, st.TTSEos) || vecEqual(st.TTSPad, st.TTSEos) {
		c.Errorf("%s: two of the TTS pad, bos and eos embeddings are equal: they are three tokens' rows", what)
	}
	if tokens >= 0 && len(st.TokenIDs) != tokens {
		c.Errorf("%s: %d token ids; want %d (prompt and generated)", what, len(st.TokenIDs), tokens)
	}
	if prompt != nil && !slices.Equal(st.PromptTokenIDs, prompt) {
		c.Errorf("%s: prompt ids %s; /tokenize says %s", what, intsString(st.PromptTokenIDs), intsString(prompt))
	}
	if len(st.TokenIDs) >= len(st.PromptTokenIDs) && !slices.Equal(st.TokenIDs[:len(st.PromptTokenIDs)], st.PromptTokenIDs) {
		c.Errorf("%s: the token ids %s do not start with the prompt ids %s", what, intsString(st.TokenIDs), intsString(st.PromptTokenIDs))
	}
}

// checkConditioningBatch: a completion asked to keep its conditioning
// answers with the handle (rows = prompt + generated − 1), and the stash
// reads once in OCND v1, consistent with its header and the request.
func checkConditioningBatch(c *checker) {
	base := c.thinker()
	for _, chat := range []bool{false, true} {
		body, what := c.completionBody(repeatPrompt, 6), "completions"
		prompt := c.tokenize(base, map[string]any{"model": c.d.Model, "prompt": repeatPrompt}).Tokens
		if chat {
			body, what = c.chatBody(repeatPrompt, 6), "chat"
			prompt = c.tokenize(base, map[string]any{"model": c.d.Model, "messages": body["messages"]}).Tokens
		}
		key := "batch/" + what
		r := c.generate(base, what, c.keep(body, key, false))
		p, g := r.Usage.PromptTokens, r.Usage.CompletionTokens
		c.wantHandle(what, r, key, p+g-1)
		c.wantStashes(base, 1, "holding one stash")
		st := c.fetch(base, key)
		c.wantStashShape(what, st, p+g-1, p+g, prompt)
		// Layer-0 rows are word embeddings: equal tokens, equal rows.
		for i := range min(len(prompt), len(st.Embed)) {
			for j := range i {
				if prompt[i] == prompt[j] && !vecEqual(st.Embed[i], st.Embed[j]) {
					c.Errorf("%s: prompt positions %d and %d hold token %d but their layer-0 rows differ: they are word embeddings", what, j, i, prompt[i])
				}
			}
		}
		c.wantGone(base, key, "a second time")
		c.wantStashes(base, 0, "after the stash was read")
	}
}

// checkConditioningRelease: DELETE frees a stash unread (204), then is a
// 404, and so is a GET.
func checkConditioningRelease(c *checker) {
	base := c.thinker()
	const key = "release/k"
	c.generate(base, "a completion", c.keep(c.completionBody(shortPrompt, 3), key, false))
	c.wantStashes(base, 1, "holding one stash")
	if r := c.call(http.MethodDelete, stashPath(base, key), c.withSecret(), nil); r.status != http.StatusNoContent {
		c.Errorf("DELETE %s: %v; want 204", key, r)
	}
	c.wantStashes(base, 0, "after DELETE")
	if r := c.call(http.MethodDelete, stashPath(base, key), c.withSecret(), nil); r.status != http.StatusNotFound {
		c.Errorf("DELETE %s again: %v; want 404", key, r)
	}
	c.wantGone(base, key, "after DELETE")
	if r := c.call(http.MethodGet, stashPath(base, "never-kept"), c.withSecret(), nil); r.status != http.StatusNotFound {
		c.Errorf("GET of a key never kept: %v; want 404", r)
	}
}

// readFrom is one GET ?from=N of a stash.
func (c *checker) readFrom(base, key string, from int) (st *stageapi.Conditioning, done bool, r reply) {
	c.Helper()
	r = c.call(http.MethodGet, stashPath(base, key)+"?from="+strconv.Itoa(from), c.withSecret(), nil)
	st, err := decodeStash(r)
	if err != nil {
		c.Fatalf("GET %s?from=%d: %v", key, from, err)
	}
	switch v := r.header.Get(stageapi.ConditioningDoneHeader); v {
	case "true":
		done = true
	case "false", "":
	default:
		c.Errorf("GET %s?from=%d: %s: %q; want true or false", key, from, stageapi.ConditioningDoneHeader, v)
	}
	return st, done, r
}

// readToEnd reads a stash from row from to its end, as the Talker does
// under async chunk, and returns its rows and the last answer's stash.
func (c *checker) readToEnd(base, key string, from int) (embed, hidden [][]float32, last *stageapi.Conditioning) {
	c.Helper()
	const safety = 1 << 16 // reads; only a worker that never says done reaches it
	for range safety {
		st, done, _ := c.readFrom(base, key, from+len(embed))
		embed, hidden, last = append(embed, st.Embed...), append(hidden, st.Hidden...), st
		if done {
			return embed, hidden, last
		}
		if c.ctx.Err() != nil {
			break
		}
	}
	c.Fatalf("GET %s?from=N: no answer said %s: true after %d rows", key, stageapi.ConditioningDoneHeader, len(embed))
	return nil, nil, nil
}

// checkConditioningStreamed: a stash kept with "stream": true reads, by
// ?from=N while the request runs, the rows a batch stash of the same
// request holds, Omnipd-Conditioning-Done on the last; a batch stash reads
// by ?from=N as a closed one.
func checkConditioningStreamed(c *checker) {
	base := c.thinker()
	body := c.completionBody(longPrompt, 12)
	ref := c.generate(base, "batch", c.keep(body, "streamed/batch", false))
	want := c.fetch(base, "streamed/batch")

	// A batch stash read by ?from=N: the rows from N, done at once.
	c.generate(base, "batch", c.keep(body, "streamed/put", false))
	st, done, _ := c.readFrom(base, "streamed/put", 2)
	if ok, where := rowsEqual(st.Hidden, want.Hidden[min(2, len(want.Hidden)):]); !ok || !done {
		c.Errorf("GET ?from=2 of a batch stash: done %v, rows against the batch rows [2:]: %s; want them, done", done, where)
	}
	c.wantGone(base, "streamed/put", "after a read that said done")

	// The streamed stash, read while the request runs: the reads start as
	// the request is sent, before the worker has the key.
	const key = "streamed/grow"
	reads, stopReads := c.child()
	defer stopReads()
	var wg sync.WaitGroup
	var gotReply reply
	wg.Go(func() {
		gotReply = c.postAside(stopReads, "the streamed-conditioning request", base+pathOf(body), c.keep(body, key, true))
	})
	embed, hidden, last := reads.readToEnd(base, key, 0)
	wg.Wait()
	got := c.decodeCompletion("the streamed-conditioning request", gotReply)
	if got.text() != ref.text() || *got.Usage != *ref.Usage {
		c.Errorf("keeping conditioning streamed changed the answer: %q %+v; batch %q %+v", got.text(), *got.Usage, ref.text(), *ref.Usage)
	}
	c.wantHandle("the streamed-conditioning request", got, key, len(want.Embed))
	if ok, where := rowsEqual(embed, want.Embed); !ok {
		c.Errorf("streamed layer-0 rows differ from the batch stash's: %s", where)
	}
	if ok, where := rowsEqual(hidden, want.Hidden); !ok {
		c.Errorf("streamed hidden rows differ from the batch stash's: %s", where)
	}
	if !vecEqual(last.TTSPad, want.TTSPad) || !vecEqual(last.TTSBos, want.TTSBos) || !vecEqual(last.TTSEos, want.TTSEos) {
		c.Errorf("the streamed stash's TTS embeddings differ from the batch stash's")
	}
	if !slices.Equal(last.PromptTokenIDs, want.PromptTokenIDs) {
		c.Errorf("the streamed stash's prompt ids %s; the batch stash's %s", intsString(last.PromptTokenIDs), intsString(want.PromptTokenIDs))
	}
	c.wantGone(base, key, "after a read that said done")
	if r := c.call(http.MethodGet, stashPath(base, key)+"?from="+strconv.Itoa(len(embed)), c.withSecret(), nil); r.status != http.StatusNotFound {
		c.Errorf("GET ?from=N of a stash read to its end: %v; want 404 at once", r)
	}
	c.wantStashes(base, 0, "after every stash was read")
}

// postAside sends a request on a goroutine of its own, beside reads that
// wait for what it makes: when it fails, they are cancelled.
func (c *checker) postAside(cancelWaiters context.CancelFunc, what, target string, body any) reply {
	r, err := c.try(http.MethodPost, target, c.withSecret(), mustJSON(body))
	if err == nil && r.status != http.StatusOK {
		err = fmt.Errorf("%v", r)
	}
	if err != nil {
		c.Errorf("%s: %v", what, err)
		cancelWaiters()
	}
	return r
}

// legs is one request served by a prefill/decode pair.
type legs struct {
	prefill, decode *completion
}

// prefillDecode serves body on p the way the orchestrator does: the
// prefill leg asks for one token nothing can end early, with the
// connector's producer params; the decode leg carries the consumer params
// built from the prefill's answer (or from configuration, sent at the same
// time, for a concurrent connector). prefillKeep and decodeKeep are extra
// fields of each leg (omnipd_conditioning).
func (c *checker) prefillDecode(p Pair, id string, body map[string]any, prefillExtra, decodeExtra map[string]any) legs {
	c.Helper()
	h := kvconnector.NewHandoff(id, p.PrefillPeer, p.DecodePeer)
	prefillID, decodeID := p.KV.RequestIDs(h)
	pre := maps.Clone(body)
	delete(pre, "stream")
	delete(pre, "stream_options")
	pre["max_tokens"], pre["ignore_eos"] = 1, true
	if params := p.KV.PrefillParams(h); params != nil {
		pre["kv_transfer_params"] = params
	}
	maps.Copy(pre, prefillExtra)
	dec := maps.Clone(body)
	maps.Copy(dec, decodeExtra)
	var out legs
	decodeLeg := func(params map[string]any) {
		if params != nil {
			dec["kv_transfer_params"] = params
		}
		out.decode = c.generate(p.Decode, "the decode leg", dec, "X-Request-Id", decodeID)
	}
	if p.KV.Dispatch() == kvconnector.Concurrent {
		params, err := p.KV.DecodeParams(h, nil)
		if err != nil {
			c.Fatalf("%s: the decode params from configuration: %v", p.KV.Name(), err)
		}
		var wg sync.WaitGroup
		var r reply
		var err2 error
		wg.Go(func() {
			r, err2 = c.try(http.MethodPost, p.Prefill+pathOf(pre), c.withSecret(), mustJSON(pre), "X-Request-Id", prefillID)
		})
		decodeLeg(params)
		wg.Wait()
		if err2 != nil {
			c.Fatalf("the prefill leg: %v", err2)
		}
		out.prefill = c.decodeCompletion("the prefill leg", r)
	} else {
		out.prefill = c.generate(p.Prefill, "the prefill leg", pre, "X-Request-Id", prefillID)
		var resp any
		if len(out.prefill.KVTransferParams) > 0 {
			resp = json.RawMessage(out.prefill.KVTransferParams)
		}
		params, err := p.KV.DecodeParams(h, resp)
		if err != nil {
			c.Fatalf("the prefill's kv_transfer_params %s cannot be handed to the decode: %v", out.prefill.KVTransferParams, err)
		}
		decodeLeg(params)
	}
	if u := out.prefill.Usage; u.CompletionTokens != 1 {
		c.Errorf("the prefill leg (max_tokens 1, ignore_eos): %d completion tokens", u.CompletionTokens)
	}
	return out
}

// checkPD: a request served by the prefill/decode pair answers the
// colocated Thinker's text, greedy and seeded, and its conditioning —
// prefill rows [0:P] then decode rows [1:] — is the colocated Thinker's,
// bit for bit.
func checkPD(c *checker) {
	colocated, pair := c.thinker(), c.pair()
	n := 0
	for _, prompt := range []string{shortPrompt, longPrompt} {
		for _, s := range samplings {
			for _, chat := range []bool{false, true} {
				n++
				body := c.completionBody(prompt, 8)
				if chat {
					body = c.chatBody(prompt, 8)
				}
				body = s.apply(body)
				what := fmt.Sprintf("%s, %s, chat %v, prompt %.12q", pair.KV.Name(), s.name, chat, prompt)
				id := fmt.Sprintf("pd-%d", n)
				want := c.generate(colocated, what+": colocated", c.keep(body, id+"/thinker", false))
				got := c.prefillDecode(pair, id, body,
					map[string]any{"omnipd_conditioning": map[string]any{"key": id + "/prefill", "layer": c.d.Layer}},
					map[string]any{"omnipd_conditioning": map[string]any{"key": id + "/decode", "layer": c.d.Layer}})
				if got.decode.text() != want.text() {
					c.Errorf("%s: the decode answers %q; colocated %q", what, got.decode.text(), want.text())
				}
				if *got.decode.Usage != *want.Usage {
					c.Errorf("%s: the decode's usage %+v; colocated %+v", what, *got.decode.Usage, *want.Usage)
				}
				p, g := want.Usage.PromptTokens, want.Usage.CompletionTokens
				// The prefill computes the prompt; the decode the last
				// prompt position again (it imported the rest), then the
				// generated ones.
				c.wantHandle(what+": prefill", got.prefill, id+"/prefill", p)
				c.wantHandle(what+": decode", got.decode, id+"/decode", g)
				ref := c.fetch(colocated, id+"/thinker")
				pre, dec := c.fetch(pair.Prefill, id+"/prefill"), c.fetch(pair.Decode, id+"/decode")
				c.wantStashShape(what+": prefill stash", pre, p, -1, ref.PromptTokenIDs)
				c.wantStashShape(what+": decode stash", dec, g, p+g, nil)
				merged, err := stageapi.MergeConditioning(pre, dec)
				if err != nil {
					c.Errorf("%s: prefill and decode stashes do not merge: %v", what, err)
					continue
				}
				if ok, where := rowsEqual(merged.Embed, ref.Embed); !ok {
					c.Errorf("%s: prefill[0:P] ++ decode[1:] layer-0 rows differ from colocated: %s", what, where)
				}
				if ok, where := rowsEqual(merged.Hidden, ref.Hidden); !ok {
					c.Errorf("%s: prefill[0:P] ++ decode[1:] hidden rows differ from colocated: %s", what, where)
				}
				if !vecEqual(merged.TTSPad, ref.TTSPad) || !vecEqual(merged.TTSBos, ref.TTSBos) || !vecEqual(merged.TTSEos, ref.TTSEos) {
					c.Errorf("%s: the TTS embeddings differ from colocated", what)
				}
				if !slices.Equal(merged.TokenIDs, ref.TokenIDs) {
					c.Errorf("%s: token ids %s; colocated %s", what, intsString(merged.TokenIDs), intsString(ref.TokenIDs))
				}
			}
		}
	}
	for name, base := range map[string]string{"colocated": colocated, "prefill": pair.Prefill, "decode": pair.Decode} {
		c.wantStashes(base, 0, name+", after every stash was read")
	}
}
