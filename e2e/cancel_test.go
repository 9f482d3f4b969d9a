package e2e

import (
	"context"
	"testing"

	"github.com/omnipd/omnipd/internal/testbed"
)

// cancelLease is far longer than any of these tests may wait (waitWithin):
// only an explicit release can free the KV in time, never the lease
// running out.
const cancelLease = 600

func leasedBlocks(w *testbed.Worker) int {
	n, _ := w.Server.KVStats()
	return n
}

// A request cancelled while its prefill's KV is exported and not yet claimed
// has that KV released at once, whichever moment the cancel lands at: the
// test holds the request at each moment with the deployment's proxies,
// cancels it there, and waits for the prefill's leased blocks to return to
// zero — long before the 60 s lease could free them.
func TestCancelReleasesExportedKV(t *testing.T) {
	for _, c := range []struct {
		name      string
		handshake string
		// hold stalls the deployment so that the request stops at the
		// moment under test; held reports it got there.
		hold func(d *testbed.Deployment)
		held func(d *testbed.Deployment) bool
	}{
		{
			// The prefill exported and answered; its answer is on its way
			// back and the orchestrator has not read it.
			name: "prefill answer not yet read", handshake: "pull",
			hold: func(d *testbed.Deployment) { d.Prefill[0].HTTP.StallResponses() },
			held: func(d *testbed.Deployment) bool { return leasedBlocks(d.Prefill[0]) > 0 },
		},
		{
			// The orchestrator read the handoff and sent the decode leg,
			// which has not reached the decode: nobody claimed the KV.
			name: "decode leg not yet claimed", handshake: "pull",
			hold: func(d *testbed.Deployment) { d.Decode[0].HTTP.Stall() },
			held: func(d *testbed.Deployment) bool {
				return leasedBlocks(d.Prefill[0]) > 0 && d.Decode[0].HTTP.Accepted() > 0
			},
		},
		{
			// Push: the prefill exported while the decode's registration on
			// the KV side channel is still in flight.
			name: "push handshake in flight", handshake: "push",
			hold: func(d *testbed.Deployment) { d.Prefill[0].KV.Stall() },
			held: func(d *testbed.Deployment) bool {
				return leasedBlocks(d.Prefill[0]) > 0 && d.Prefill[0].KV.Accepted() > 0
			},
		},
	} {
		for _, stream := range []bool{false, true} {
			t.Run(c.name+"/"+streamName(stream), func(t *testing.T) {
				d := testbed.Start(t, testbed.Options{Handshake: c.handshake, LeaseSeconds: cancelLease, NoSharedMemory: true})
				c.hold(d)
				ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
				defer cancel()
				done := make(chan answer, 1)
				go func() {
					done <- send(ctx, d, chatPath, textChat("a prompt long enough to span several KV blocks of sixteen positions each", 8, stream))
				}()
				waitFor(t, "the request to reach "+c.name, func() bool { return c.held(d) })
				cancel()
				<-done
				waitFor(t, "the cancelled request's KV to be released", func() bool { return leasedBlocks(d.Prefill[0]) == 0 })
				for _, w := range d.Workers() {
					w.HTTP.Resume()
					if w.KV != nil {
						w.KV.Resume()
					}
				}
				if _, expired := d.Prefill[0].Server.KVStats(); expired != 0 {
					t.Errorf("%d leases expired; want every one released", expired)
				}
			})
		}
	}
}
