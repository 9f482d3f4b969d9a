package stagetest

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/omnipd/omnipd/stageapi"
)

// runningMetric is vLLM's gauge of the requests an engine computes
// (PrometheusStatLogger's gauge_scheduler_running,
// vllm/v1/metrics/loggers.py@005a810bc40faa25b8870fbc8559c3462581eee3),
// which a Thinker's /metrics carries in vLLM's shape.
const runningMetric = "vllm:num_requests_running"

// openStream sends body and returns once the answer's first SSE line is
// in, with that line; disconnect closes the connection.
func (c *checker) openStream(target string, body any) (first string, disconnect func()) {
	c.Helper()
	ctx, cancel := context.WithCancel(c.ctx)
	resp, err := c.open(ctx, http.MethodPost, target, c.withSecret(), mustJSON(body))
	if err != nil {
		cancel()
		c.Fatalf("POST %s: %v", target, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		c.Fatalf("POST %s: %v", target, reply{resp.StatusCode, resp.Header, b})
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil {
		resp.Body.Close()
		cancel()
		c.Fatalf("POST %s: the stream ended before its first event: %v", target, err)
	}
	return strings.TrimSpace(line), func() { cancel(); resp.Body.Close() }
}

// idle waits until base computes no request, by vLLM's gauge, and says
// whether it could tell.
func (c *checker) idle(base string) bool {
	c.Helper()
	if _, ok := c.metric(base, runningMetric); !ok {
		c.Errorf("%s/metrics has no %s (vLLM's gauge of running requests): the check cannot tell when the worker stopped the request", base, runningMetric)
		return false
	}
	if !c.eventually(func() bool { v, _ := c.metric(base, runningMetric); return v == 0 }) {
		v, _ := c.metric(base, runningMetric)
		c.Errorf("%s: %s is %v long after its only client went away; want 0", base, runningMetric, v)
		return false
	}
	return true
}

// checkDisconnectThinker: a client that disconnects from a streamed
// completion that keeps conditioning stops it, and nothing is stashed for
// it.
func checkDisconnectThinker(c *checker) {
	base := c.thinker()
	_, maxLen := c.modelCard(base)
	for _, chat := range []bool{false, true} {
		body, what := c.completionBody(longPrompt, 1), "completions"
		p := c.tokenize(base, map[string]any{"model": c.d.Model, "prompt": longPrompt}).Count
		if chat {
			body, what = c.chatBody(longPrompt, 1), "chat"
			p = c.tokenize(base, map[string]any{"model": c.d.Model, "messages": body["messages"]}).Count
		}
		// Thousands of tokens: the client goes away after the first, so a
		// worker that stopped when it went away kept nothing; one that
		// kept rows went on without it.
		maxTokens := min(maxLen-p, 4096)
		body["max_tokens"], body["ignore_eos"], body["stream"] = maxTokens, true, true
		key := "disconnect/" + what
		first, cancel := c.openStream(base+pathOf(body), c.keep(body, key, false))
		cancel()
		if strings.Contains(first, "[DONE]") {
			c.Fatalf("%s: the stream's first event is [DONE]", what)
		}
		if !c.idle(base) {
			continue
		}
		if n := c.stashes(base); n != 0 {
			st := c.fetch(base, key)
			c.Errorf("%s: %d stashes held after the client went away after the first of %d tokens (%d rows kept): a worker stops a request whose client is gone, and keeps nothing of it",
				what, n, maxTokens, len(st.Embed))
		}
	}
}

// checkDisconnectTalker: a client that disconnects from a Talker stream
// (async chunk, the Thinker still decoding) leaves no stash held on the
// Thinker: the Talker releases what it did not read to its end.
func checkDisconnectTalker(c *checker) {
	thinker, talker := c.thinker(), c.talker()
	body := c.chatBody(longPrompt, 48)
	body["ignore_eos"] = true
	const key = "disconnect/talker"
	tc, stop := c.child()
	defer stop()
	var wg sync.WaitGroup
	var thinkerReply reply
	wg.Go(func() {
		thinkerReply = c.postAside(stop, "the Thinker leg", thinker+pathOf(body), c.keep(body, key, true))
	})
	req := talkerSamplings[1].req
	req.MaxFrames, req.AsyncChunk = 4096, true
	req.Conditioning = []stageapi.ConditioningHandle{{URL: thinker, Key: key}}
	first, disconnect := tc.openStream(talker+stageapi.TalkerPath, req)
	disconnect()
	wg.Wait()
	c.decodeCompletion("the Thinker leg", thinkerReply)
	if strings.Contains(first, `"done"`) {
		c.Logf("the Talker ended (%s) before the client went away", first)
	}
	if !c.eventually(func() bool { return c.stashes(thinker) == 0 }) {
		c.Errorf("the Thinker holds %d stashes long after the Talker's client went away; the Talker must release what it did not read to its end",
			c.stashes(thinker))
	}
	c.idle(thinker)
	if r := c.call(http.MethodGet, talker+"/health", "", nil); r.status != http.StatusOK {
		c.Errorf("the Talker's /health after a client went away: %v", r)
	}
}
