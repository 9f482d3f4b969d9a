package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/omnipd/omnipd/internal/testbed"
)

// A killed instance costs no request that comes after it, whatever its
// stage: with two instances of the stage and one killed, every later
// request — chat and completions, whole and streamed, spoken where the
// stage is an audio one, some at once — succeeds. A leg the dead instance
// refuses reached nothing and goes to the live one (counted in
// omnipd_stage_refused_retries_total); the dead one then sits out until it
// is seen healthy, which it never is. Afterwards the deployment holds
// nothing.
func TestKilledInstanceCostsNoLaterRequest(t *testing.T) {
	text := func(i int) (string, string, bool) {
		stream := i%2 == 1
		if i%4 >= 2 {
			return completionPath, completionBody(fmt.Sprintf("after the kill %d", i), 6, stream), stream
		}
		return chatPath, textChat(fmt.Sprintf("after the kill %d", i), 6, stream), stream
	}
	spoken := func(i int) (string, string, bool) {
		stream := i%2 == 1
		return chatPath, chatBody(fmt.Sprintf("speak %d", i), 4, stream, ""), stream
	}
	media := func(i int) (string, string, bool) {
		stream := i%2 == 1
		return chatPath, mediaChat(400+i, stream, ""), stream
	}
	for _, tc := range []struct {
		name   string
		opts   testbed.Options
		stage  string // the pool's name, the metric's stage label
		victim func(*testbed.Deployment) interface{ Kill() }
		body   func(i int) (path, body string, stream bool)
	}{
		{"prefill", testbed.Options{Prefills: 2}, "prefill",
			func(d *testbed.Deployment) interface{ Kill() } { return d.Prefill[0] }, text},
		{"decode, pull", testbed.Options{Decodes: 2}, "decode",
			func(d *testbed.Deployment) interface{ Kill() } { return d.Decode[0] }, text},
		{"decode, push", testbed.Options{Decodes: 2, Handshake: "push"}, "decode",
			func(d *testbed.Deployment) interface{ Kill() } { return d.Decode[0] }, text},
		{"decode, spoken, async chunk", testbed.Options{Decodes: 2, Omni: true, AsyncChunk: true}, "decode",
			func(d *testbed.Deployment) interface{ Kill() } { return d.Decode[0] }, spoken},
		{"colocated thinker", testbed.Options{Colocated: true, Decodes: 2}, "thinker",
			func(d *testbed.Deployment) interface{ Kill() } { return d.Decode[0] }, text},
		{"encoder", testbed.Options{Encoders: 2}, "encoder",
			func(d *testbed.Deployment) interface{ Kill() } { return d.Encoder[0] }, media},
		{"talker", testbed.Options{Omni: true, Talkers: 2}, "talker",
			func(d *testbed.Deployment) interface{ Kill() } { return d.Talkers[0] }, spoken},
		{"talker, async chunk", testbed.Options{Omni: true, AsyncChunk: true, Talkers: 2}, "talker",
			func(d *testbed.Deployment) interface{ Kill() } { return d.Talkers[0] }, spoken},
		{"code2wav", testbed.Options{Omni: true, Code2Wavs: 2}, "code2wav",
			func(d *testbed.Deployment) interface{ Kill() } { return d.Code2Wavs[0] }, spoken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := testbed.Start(t, tc.opts)
			warm(t, d)
			tc.victim(d).Kill()
			ctx, cancel := context.WithTimeout(context.Background(), 3*reqTimeout)
			defer cancel()
			check := func(i int) {
				path, body, stream := tc.body(i)
				if err := wellFormed(send(ctx, d, path, body), stream); err != nil {
					t.Errorf("request %d after the kill: %v", i, err)
				}
			}
			// One after another, then four at once.
			for i := range 4 {
				check(i)
			}
			var wg sync.WaitGroup
			for i := 4; i < 8; i++ {
				wg.Go(func() { check(i) })
			}
			wg.Wait()
			if n := metric(t, d, `omnipd_stage_refused_retries_total{stage="`+tc.stage+`"}`); n < 1 {
				t.Errorf("no leg was moved off the dead %s instance (%v counted): the test did not reach it", tc.stage, n)
			}
			d.Settled(t, settleWithin)
		})
	}
}
