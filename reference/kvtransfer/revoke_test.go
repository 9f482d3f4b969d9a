package kvtransfer

import (
	"errors"
	"testing"
)

// Revoke frees a leased key at once, and a key revoked before it was
// exported — a cancelled request whose prefill had not finished — is
// refused at Export, so its blocks go back to the engine instead of
// waiting out a lease nobody will claim. The memory of a revoked key lasts
// one lease.
func TestRevoke(t *testing.T) {
	checkGoroutines(t)
	r := newRig(t, rigOpts{})

	r.export(t, "req-late", 2, 5)
	if !r.p.Revoke("req-late") {
		t.Fatal("Revoke of a leased key = false")
	}
	if u := r.ps.inUse(); u != 0 {
		t.Fatalf("revoked lease left %d blocks in use", u)
	}

	if r.p.Revoke("req-early") {
		t.Fatal("Revoke of a key not exported = true")
	}
	ids := r.ps.allocate(t, 2)
	if err := r.p.Export("req-early", ids, 20); !errors.Is(err, ErrRevoked) {
		t.Fatalf("Export of a revoked key: err = %v, want ErrRevoked", err)
	}
	wantStats(t, r.p, ProducerStats{Released: 1})
	r.ps.Free(ids) // a refused export leaves the blocks with the caller

	r.clock.Advance(testLease)
	r.p.ExpireNow()
	r.export(t, "req-early", 1, 6) // a lease later the key is forgotten
	wantStats(t, r.p, ProducerStats{LeasedTransfers: 1, LeasedBlocks: 1, Released: 1})
}
