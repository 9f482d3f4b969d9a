package kvnotice

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"
)

// pushPeer is an LMCache PD sender's socket as the wire shows it: a ZMQ
// PUSH that connects, greets with NULL security, sends READY, then one
// msgpack frame per ProxyNotif (msgspec's tagged-struct encoding).
type pushPeer struct {
	c net.Conn
	r *bufio.Reader
}

func dialPush(t *testing.T, addr string) *pushPeer {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	g := greeting()
	g[32] = 0
	if _, err := c.Write(g); err != nil {
		t.Fatal(err)
	}
	p := &pushPeer{c: c, r: bufio.NewReader(c)}
	var peer [64]byte
	if _, err := io.ReadFull(p.r, peer[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(command("READY", "Socket-Type", "PUSH")); err != nil {
		t.Fatal(err)
	}
	flags, body, err := readFrame(p.r)
	if err != nil || flags&0x04 == 0 {
		t.Fatalf("no READY from the PULL end: %v", err)
	}
	if name, props := parseCommand(body); name != "READY" || props["socket-type"] != "PULL" {
		t.Fatalf("the PULL end answered %s %v", name, props)
	}
	return p
}

func notif(id string) []byte {
	b := []byte{0x82, 0xa4}
	b = append(b, "type"...)
	b = append(b, 0xaa)
	b = append(b, "ProxyNotif"...)
	b = append(b, 0xa6)
	b = append(b, "req_id"...)
	b = append(b, 0xd9, byte(len(id)))
	return append(b, id...)
}

func (p *pushPeer) send(t *testing.T, msg []byte) {
	t.Helper()
	if _, err := p.c.Write(append([]byte{0x00, byte(len(msg))}, msg...)); err != nil {
		t.Fatal(err)
	}
}

func serve(t *testing.T, b *Board) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&Listener{Board: b, Logger: slog.New(slog.DiscardHandler)}).Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// The listener drains what senders push — more than a PUSH socket's
// default high-water mark of 1000, past which an undrained sender blocks —
// and a request waiting for its notices (one per decode TP rank) gets them.
func TestListenerDrainsSenders(t *testing.T) {
	b := &Board{}
	addr := serve(t, b)
	ranks := [2]*pushPeer{dialPush(t, addr), dialPush(t, addr)}
	const n = 1500
	for i := range n {
		for _, p := range ranks {
			p.send(t, notif(fmt.Sprintf("xfer-%d", i)))
		}
	}
	for i := range n {
		if err := b.Await(context.Background(), fmt.Sprintf("xfer-%d", i), 2); err != nil {
			t.Fatal(err)
		}
	}
	if p := b.Pending(); p != 0 {
		t.Errorf("%d ids remembered after every request took its notices", p)
	}
}

func TestListenerRefusesOtherMessages(t *testing.T) {
	b := &Board{}
	addr := serve(t, b)
	p := dialPush(t, addr)
	p.send(t, []byte{0x92, 0xa1, 'x', 0xa1, 'y'}) // an array, not a ProxyNotif
	if _, err := p.r.ReadByte(); err == nil {
		t.Error("the connection stayed open after a message that is not a ProxyNotif")
	}
	if b.Pending() != 0 {
		t.Error("a malformed message was counted")
	}
}

func TestBoard(t *testing.T) {
	b := &Board{Capacity: 2}
	b.Done("a") // before anyone waits: kept
	if err := b.Await(context.Background(), "a", 1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Await(ctx, "never", 1); err != context.Canceled {
		t.Errorf("Await with a cancelled context: %v", err)
	}
	for _, id := range []string{"x", "y", "z"} {
		b.Done(id) // never awaited: the oldest is forgotten past Capacity
	}
	if p := b.Pending(); p != 2 {
		t.Errorf("%d ids remembered, want the capacity 2", p)
	}
}
