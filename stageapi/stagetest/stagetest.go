// Package stagetest is the conformance suite of omnipd's stage API
// (docs/stage-api.md): the wire checks every stage worker must pass — a
// Thinker (colocated, or a prefill/decode pair whose KV moves by a KV
// connector) serving vLLM's OpenAI API and omnipd's conditioning stash, a
// Talker and a Code2Wav — whatever engine it runs. The reference workers
// and the vllm-omni stage worker both run it, the way every slog handler
// runs testing/slogtest.
//
// The checks talk to the instances over real HTTP only. Where the contract
// fixes a value (16 ids per frame, 1920 samples per frame, rows = prompt +
// generated − 1) they check it; everywhere else they compare an engine
// with itself — PD against colocated, chunked against whole, streamed
// against batch — so that one suite holds for any model.
package stagetest

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/omnipd/omnipd/kvconnector"
)

// Deployment is how the suite starts the instances it checks. Each starter
// is called from within one check, with that check's *testing.T: the
// instance lives as long as the check (stop it in t.Cleanup), so that what
// one check leaves behind never shows in another. A starter returns once
// the instance is ready (its /health answers 200), or fails t. A nil
// starter skips the checks that need that stage.
type Deployment struct {
	// Secret is the deployment secret every instance requires of callers
	// and the Talker sends when it fetches conditioning.
	Secret string
	// Model is the Thinker's served model name: the id of its one model
	// card and the model the checks' requests name.
	Model string
	// Layer is the hidden layer the checks ask the Thinker to keep
	// (omnipd_conditioning.layer), one the Talker reads.
	Layer int
	// Thinker starts a colocated Thinker (a full stage: it prefills and
	// decodes) and returns its base URL.
	Thinker func(t *testing.T) string
	// PD starts a prefill and a decode Thinker of the same model.
	PD func(t *testing.T) Pair
	// Talker starts a Talker that fetches conditioning from the Thinkers
	// the other starters start, with Secret.
	Talker func(t *testing.T) string
	// Code2Wav starts a Code2Wav stage.
	Code2Wav func(t *testing.T) string
}

// Pair is a prefill and a decode Thinker whose KV moves by a connector.
type Pair struct {
	// Prefill and Decode are the instances' base URLs.
	Prefill, Decode string
	// KV is the connector's router-side contract, as
	// kvconnector.Registry.Lookup builds it from the instances'
	// kv_transfer_config: the suite drives the pair exactly as the
	// orchestrator does (orchestrator/legs.go) — the prefill leg with its
	// producer params, max_tokens 1 and ignore_eos, the decode leg with
	// the consumer params built from the prefill's answer, in the
	// contract's dispatch order and with its X-Request-Id values.
	KV kvconnector.Contract
	// PrefillPeer and DecodePeer describe the instances as a deploy config
	// does; contracts that build the decode leg from configuration
	// (Mooncake, the reference push handshake) read them.
	PrefillPeer, DecodePeer kvconnector.Peer
}

// reporter is the part of *testing.T a check reports to, so that a check
// can run against a recorder as well: the suite's own tests prove each
// check fails against a worker that breaks the contract. A check calls
// Fatalf only on the goroutine it runs on.
type reporter interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

var _ reporter = (*testing.T)(nil)

// stage is a kind of instance a check needs.
type stage int

const (
	thinkerStage stage = 1 << iota
	pdStage
	talkerStage
	code2wavStage
)

// check is one wire check of docs/stage-api.md.
type check struct {
	name  string
	needs stage
	run   func(c *checker)
}

// checks is the suite, in the order a reader of docs/stage-api.md meets
// what each one pins.
var checks = []check{
	{"Secret", 0, checkSecret},
	{"Health", 0, checkHealth},
	{"Models", thinkerStage, checkModels},
	{"TokenizeDetokenize", thinkerStage, checkTokenize},
	{"Completions", thinkerStage, checkCompletions},
	{"ChatCompletions", thinkerStage, checkChatCompletions},
	{"ConditioningBatch", thinkerStage, checkConditioningBatch},
	{"ConditioningRelease", thinkerStage, checkConditioningRelease},
	{"ConditioningStreamed", thinkerStage, checkConditioningStreamed},
	{"PDEqualsColocated", thinkerStage | pdStage, checkPD},
	{"Media", thinkerStage, checkMedia},
	{"Talker", thinkerStage | talkerStage, checkTalker},
	{"TalkerPDEqualsColocated", thinkerStage | pdStage | talkerStage, checkTalkerPD},
	{"TalkerAsyncChunk", thinkerStage | pdStage | talkerStage, checkTalkerAsyncChunk},
	{"TalkerMissingConditioning", thinkerStage | talkerStage, checkTalkerMissing},
	{"Code2Wav", code2wavStage, checkCode2Wav},
	{"BadInputThinker", thinkerStage, checkBadInputThinker},
	{"BadInputTalker", talkerStage, checkBadInputTalker},
	{"BadInputCode2Wav", code2wavStage, checkBadInputCode2Wav},
	{"DisconnectThinker", thinkerStage, checkDisconnectThinker},
	{"DisconnectTalker", thinkerStage | talkerStage, checkDisconnectTalker},
}

// Run runs every check against d, each as a subtest of t named for what
// it pins ("Secret", "PDEqualsColocated", "TalkerAsyncChunk", …), so that
// -run can pick one.
func Run(t *testing.T, d Deployment) {
	t.Helper()
	for _, ch := range checks {
		t.Run(ch.name, func(t *testing.T) {
			if missing := d.missing(ch.needs); missing != "" {
				t.Skipf("the deployment has no %s", missing)
			}
			c := newChecker(t, t, d)
			defer c.close()
			ch.run(c)
		})
	}
}

// missing names the first stage of needs d cannot start, "" when none.
func (d Deployment) missing(needs stage) string {
	switch {
	case needs&thinkerStage != 0 && d.Thinker == nil:
		return "colocated Thinker"
	case needs&pdStage != 0 && d.PD == nil:
		return "prefill/decode pair"
	case needs&talkerStage != 0 && d.Talker == nil:
		return "Talker"
	case needs&code2wavStage != 0 && d.Code2Wav == nil:
		return "Code2Wav"
	}
	return ""
}

// checker is one check's state: where it reports, what it starts instances
// with, and its HTTP client.
type checker struct {
	reporter
	d Deployment
	// life is the test the check's instances live as long as.
	life *testing.T
	// ctx bounds every call of the check: the test's deadline, less a
	// margin so that a hung worker fails the check with a message rather
	// than the test binary with a panic.
	ctx    context.Context
	cancel context.CancelFunc
	http   *http.Client
}

func newChecker(tb reporter, life *testing.T, d Deployment) *checker {
	var ctx context.Context
	var cancel context.CancelFunc
	if deadline, ok := life.Deadline(); ok {
		// A tenth of what is left, at most a minute, is room to report.
		margin := min(time.Until(deadline)/10, time.Minute)
		ctx, cancel = context.WithDeadline(life.Context(), deadline.Add(-margin))
	} else {
		ctx, cancel = context.WithCancel(life.Context())
	}
	// A transport of its own: the check's connections close with it, so a
	// caller's goroutine count is not disturbed by idle keep-alives.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	return &checker{reporter: tb, d: d, life: life, ctx: ctx, cancel: cancel, http: &http.Client{Transport: tr}}
}

func (c *checker) close() {
	c.cancel()
	c.http.CloseIdleConnections()
}

// child is c with calls its own cancel ends too: a check that waits on a
// worker for what another request makes stops waiting when that request
// fails.
func (c *checker) child() (*checker, context.CancelFunc) {
	ctx, cancel := context.WithCancel(c.ctx)
	cc := *c
	cc.ctx = ctx
	return &cc, cancel
}

func (c *checker) thinker() string  { return c.d.Thinker(c.life) }
func (c *checker) pair() Pair       { return c.d.PD(c.life) }
func (c *checker) talker() string   { return c.d.Talker(c.life) }
func (c *checker) code2wav() string { return c.d.Code2Wav(c.life) }
