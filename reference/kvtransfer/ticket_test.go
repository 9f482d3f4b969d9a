//go:build linux

package kvtransfer

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// ticketPull exports n blocks under key from seed and pulls them with the
// producer's ticket into fresh blocks of the rig's consumer.
func (r *rig) ticketPull(t *testing.T, key string, n int, seed uint64) ([]int, error) {
	t.Helper()
	r.export(t, key, n, seed)
	ticket := r.p.Ticket(key)
	if ticket == "" {
		t.Fatalf("no ticket for %q", key)
	}
	dst := r.cs.allocate(t, n)
	_, err := r.c.PullWithTicket(testCtx(t), r.addr, testEngine, key, ticket, dst)
	return dst, err
}

// ticketPullOnce is ticketPull, checked: the blocks arrive intact, and the
// producer frees the lease on the notification.
func (r *rig) ticketPullOnce(t *testing.T, key string, n int, seed uint64) {
	t.Helper()
	before := r.p.Stats().Completed
	dst, err := r.ticketPull(t, key, n, seed)
	if err != nil {
		t.Fatal(err)
	}
	checkPattern(t, r.cs, dst, seed)
	r.cs.Free(dst)
	waitFor(t, "the producer to take the notification", func() bool { return r.p.Stats().Completed > before })
}

// TestTicketPull: the first pull from a producer maps its region; from then
// on the consumer copies on the producer's tickets, the blocks arrive
// intact, and the producer frees every lease on the notifications.
func TestTicketPull(t *testing.T) {
	checkGoroutines(t)
	r := newRig(t, rigOpts{shared: true, prod: func(c *Config) { c.Secret = "s3cret" }, cons: func(c *Config) { c.Secret = "s3cret" }})
	const rounds = 6
	for i := range rounds {
		n := 1 + i%3
		dst, err := r.ticketPull(t, fmt.Sprint("k", i), n, uint64(30+i))
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		checkPattern(t, r.cs, dst, uint64(30+i))
		r.cs.Free(dst)
	}
	if st := r.c.Stats(); st.SharedTransfers != rounds || st.TicketTransfers != rounds-1 || st.StreamedTransfers != 0 {
		t.Errorf("consumer stats %+v: want %d transfers through shared memory, all but the first on a ticket", st, rounds)
	}
	waitStats(t, r.p, ProducerStats{Completed: rounds})
}

// TestTicketClosedConsumerNotifies: a consumer closed right after its
// ticket copies still tells the producer, so no lease waits for expiry,
// and so does one closed while it copies.
func TestTicketClosedConsumerNotifies(t *testing.T) {
	checkGoroutines(t)
	r := newRig(t, rigOpts{shared: true})
	r.pullOnce(t, "first", 1, 1)
	const copies = 20
	for i := range copies {
		dst, err := r.ticketPull(t, fmt.Sprint("k", i), 2, uint64(i))
		if err != nil {
			t.Fatal(err)
		}
		r.cs.Free(dst)
	}
	r.c.afterSharedCopy = func() { r.c.Close() }
	dst, err := r.ticketPull(t, "last", 1, 99)
	if err != nil {
		t.Fatal(err)
	}
	checkPattern(t, r.cs, dst, 99)
	if st := r.c.Stats(); st.TicketTransfers != copies+1 {
		t.Errorf("consumer stats %+v, want %d on a ticket", st, copies+1)
	}
	waitStats(t, r.p, ProducerStats{Completed: 2 + copies})
}

// TestTicketNotifyAfterProducerDrop: when the producer has dropped the
// notification stream (as on its idle bound), the next notification goes
// on a fresh connection instead of into the dead one, so the lease is
// freed and does not wait for its expiry.
func TestTicketNotifyAfterProducerDrop(t *testing.T) {
	checkGoroutines(t)
	r := newRig(t, rigOpts{shared: true})
	r.pullOnce(t, "first", 1, 1)
	r.ticketPullOnce(t, "k1", 1, 2)
	r.p.dropConns(t)
	r.ticketPullOnce(t, "k2", 1, 3)
	waitStats(t, r.p, ProducerStats{Completed: 3})
}

// TestTicketSenderIdles: the notification sender ends, and its connection
// closes, once the consumer has had nothing to send for its idle timeout.
func TestTicketSenderIdles(t *testing.T) {
	checkGoroutines(t)
	r := newRig(t, rigOpts{shared: true, cons: func(c *Config) { c.IdleTimeout = 50 * time.Millisecond }})
	r.pullOnce(t, "first", 1, 1)
	r.ticketPullOnce(t, "k", 1, 2)
	waitFor(t, "the sender and the pooled connection to go", func() bool {
		r.c.mu.Lock()
		senders := len(r.c.notifies)
		r.c.mu.Unlock()
		return senders == 0 && r.p.producerConns() == 0
	})
}

// TestTicketNotUsable: a ticket the consumer cannot use — not one, not
// signed by the region's key for this key, engine and geometry, for a
// region it has not mapped, for another number of blocks — makes it pull
// instead, so the outcome is the pull's: the blocks, or the refusal that
// says what differs.
func TestTicketNotUsable(t *testing.T) {
	checkGoroutines(t)
	r := newRig(t, rigOpts{shared: true})
	r.pullOnce(t, "first", 1, 1)
	other := newRig(t, rigOpts{shared: true})
	other.export(t, "elsewhere", 2, 5)

	resign := func(ticket string, edit func([]byte)) string {
		b, _ := base64.RawURLEncoding.DecodeString(ticket)
		edit(b)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	tests := []struct {
		name    string
		ticket  func(own string) string
		engine  string
		blocks  int
		wantErr error
	}{
		{name: "garbage", ticket: func(string) string { return "not a ticket!" }},
		{name: "truncated", ticket: func(own string) string { return own[:len(own)/2] }},
		{name: "other version", ticket: func(own string) string { return resign(own, func(b []byte) { b[0]++ }) }},
		{name: "block moved", ticket: func(own string) string {
			return resign(own, func(b []byte) {
				b[1+sharedIDLen+2]++ // the first block's slot (one byte: a short count and a small slot)
			})
		}},
		{name: "another lease's ticket", ticket: func(string) string { r.export(t, "decoy", 2, 6); return r.p.Ticket("decoy") }},
		{name: "another producer's region", ticket: func(string) string { return other.p.Ticket("elsewhere") }},
		{name: "other engine", ticket: func(own string) string { return own }, engine: "prefill-9", wantErr: ErrEngineMismatch},
		{name: "other block count", ticket: func(own string) string { return own }, blocks: 3, wantErr: ErrBlockCount},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := fmt.Sprint("k", i)
			r.export(t, key, 2, uint64(40+i))
			engine, blocks := testEngine, 2
			if tt.engine != "" {
				engine = tt.engine
			}
			if tt.blocks != 0 {
				blocks = tt.blocks
			}
			dst := r.cs.allocate(t, blocks)
			defer r.cs.Free(dst)
			before := r.c.Stats()
			_, err := r.c.PullWithTicket(testCtx(t), r.addr, engine, key, tt.ticket(r.p.Ticket(key)), dst)
			if after := r.c.Stats(); after.TicketTransfers != before.TicketTransfers {
				t.Errorf("a transfer on this ticket: stats %+v", after)
			}
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want the pull's %v", err, tt.wantErr)
				}
				r.p.Release(key)
				return
			}
			if err != nil {
				t.Fatalf("the pull instead: %v", err)
			}
			checkPattern(t, r.cs, dst, uint64(40+i))
		})
	}
	r.p.Release("decoy")
}

// TestTicketOtherGeometry: a consumer whose cache has another shape does
// not take the ticket, and its pull is refused as a shape mismatch.
func TestTicketOtherGeometry(t *testing.T) {
	checkGoroutines(t)
	r := newRig(t, rigOpts{shared: true})
	r.pullOnce(t, "first", 1, 1)
	r.export(t, "k", 1, 2)
	r.c.cfg.Shape = "layers=3"
	dst := r.cs.allocate(t, 1)
	defer r.cs.Free(dst)
	if _, err := r.c.PullWithTicket(testCtx(t), r.addr, testEngine, "k", r.p.Ticket("k"), dst); !errors.Is(err, ErrShape) {
		t.Fatalf("err = %v, want ErrShape", err)
	}
	r.p.Release("k")
}

// TestTicketFreedDuringCopy: when the producer frees a lease while a
// consumer copies it on its ticket, the copy is void (ErrUnknownTransfer)
// and nothing is notified.
func TestTicketFreedDuringCopy(t *testing.T) {
	checkGoroutines(t)
	r := newRig(t, rigOpts{shared: true})
	r.pullOnce(t, "first", 1, 1)
	r.c.afterSharedCopy = func() { r.p.Release("k") }
	dst, err := r.ticketPull(t, "k", 3, 7)
	defer r.cs.Free(dst)
	if !errors.Is(err, ErrUnknownTransfer) || !strings.Contains(err.Error(), "ticket") {
		t.Fatalf("err = %v, want ErrUnknownTransfer on the ticket", err)
	}
	if st := r.c.Stats(); st.TicketTransfers != 0 {
		t.Errorf("consumer stats %+v, want no transfer on a ticket", st)
	}
	wantStats(t, r.p, ProducerStats{Completed: 1, Released: 1})
}

// TestTicketWhileStreamed: a notification for a lease another consumer is
// pulling right now cuts that stream and frees the blocks once it lets go.
func TestTicketWhileStreamed(t *testing.T) {
	checkGoroutines(t)
	const blocks = 16
	r := newRig(t, rigOpts{shared: true, blocks: 2 * blocks})
	r.pullOnce(t, "first", 1, 1)
	r.export(t, "k", blocks, 8)
	ticket := r.p.Ticket("k")
	unstall, done := stalledPull(t, testCtx(t), r, "k", blocks)
	defer unstall()
	dst := r.cs.allocate(t, blocks)
	defer r.cs.Free(dst)
	if _, err := r.c.PullWithTicket(testCtx(t), r.addr, testEngine, "k", ticket, dst); err != nil {
		t.Fatal(err)
	}
	checkPattern(t, r.cs, dst, 8)
	waitStats(t, r.p, ProducerStats{Completed: 1, Released: 1})
	unstall()
	if err := <-done; err == nil {
		t.Fatal("the stalled pull of a lease copied on its ticket succeeded")
	}
}

// TestNotifyAuth: with a secret, a notification stream is refused without
// the proof of it, as any request is.
func TestNotifyAuth(t *testing.T) {
	checkGoroutines(t)
	r := newRig(t, rigOpts{shared: true, prod: func(c *Config) { c.Secret = "s3cret" }})
	typ, payload := rawSession(t, r.addr, requestMsg{Op: opNotify})
	if err := refusalFrom(payload); typ != frameError || !errors.Is(err, ErrAuth) {
		t.Fatalf("type %d err = %v, want ErrAuth", typ, err)
	}
}

// signedTicket is a ticket for key signed with r's producer key, naming
// one block by slot and generation: what a broken producer could send.
func signedTicket(r *rig, key string, numTokens, slot, generation uint64) string {
	b := append([]byte{ticketVersion}, r.ps.shm.id[:]...)
	b = binary.AppendUvarint(b, numTokens)
	b = binary.AppendUvarint(b, 1)
	b = binary.AppendUvarint(b, slot)
	b = binary.AppendUvarint(b, generation)
	b = append(b, ticketMAC(r.ps.shm.ticketKey[:], key, testEngine, testShape, r.ps.bb, b)...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// TestTicketOutsideRegion: a ticket that verifies but names a block
// outside the producer's region — a broken producer — fails the transfer
// as a protocol error, whatever the slot, without reading a byte.
func TestTicketOutsideRegion(t *testing.T) {
	checkGoroutines(t)
	r := newRig(t, rigOpts{shared: true, blocks: 4})
	r.pullOnce(t, "first", 1, 1)
	for _, slot := range []uint64{4, 1 << 40, math.MaxUint64} {
		dst := r.cs.allocate(t, 1)
		_, err := r.c.PullWithTicket(testCtx(t), r.addr, testEngine, "k", signedTicket(r, "k", 5, slot, 0), dst)
		if !errors.Is(err, ErrProtocol) {
			t.Errorf("slot %d: err = %v, want ErrProtocol", slot, err)
		}
		r.cs.Free(dst)
	}
	// The same ticket in a slot of the region verifies and copies.
	r.export(t, "k", 1, 3)
	dst := r.cs.allocate(t, 1)
	defer r.cs.Free(dst)
	// The rig's "first" lease is gone; "k" holds the one block in use.
	slot := slices.Index(r.ps.used, true)
	off, _ := r.ps.shm.offset(r.ps.Block(slot))
	gen := r.ps.shm.generation(off, r.ps.bb).Load()
	if _, err := r.c.PullWithTicket(testCtx(t), r.addr, testEngine, "k", signedTicket(r, "k", 5, uint64(slot), gen), dst); err != nil {
		t.Fatalf("slot %d: %v", slot, err)
	}
	checkPattern(t, r.cs, dst, 3)
}

// FuzzParseTicket: whatever a kv_transfer_params object carries as a
// ticket, parsing it neither panics nor accepts more blocks than a ticket
// may name.
func FuzzParseTicket(f *testing.F) {
	f.Add("")
	f.Add("AQ")
	f.Add("ATYxwkll2dTxzetLCpDCEgEAAAAAAAAAUgAAAAYAAAAAABkQAAAAAAAAAAAAAAAAAAAZUA")
	f.Add(base64.RawURLEncoding.EncodeToString(append(append([]byte{ticketVersion}, make([]byte, sharedIDLen)...), 5, 1, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16)))
	f.Fuzz(func(t *testing.T, s string) {
		tk, err := parseTicket(s)
		if err == nil && (len(tk.slots) == 0 || len(tk.slots) > maxTicketBlocks || len(tk.mac) != ticketMACLen) {
			t.Fatalf("parsed %q into %d blocks and a %d-byte signature", s, len(tk.slots), len(tk.mac))
		}
	})
}
