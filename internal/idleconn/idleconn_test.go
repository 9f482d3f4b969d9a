package idleconn

import (
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"
)

// pair is a loopback TCP connection: the client's end and the server's.
func pair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// eventually checks until the answer is not nil, as what the peer did
// reaches the client's socket a moment later.
func eventually(t *testing.T, p *Probe, c net.Conn) error {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if err := p.Check(c); err != nil {
			return err
		}
	}
	t.Fatal("the check kept passing")
	return nil
}

func TestCheck(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" {
		t.Skip("no non-blocking probe here")
	}
	t.Run("quiet", func(t *testing.T) {
		c, _ := pair(t)
		var p Probe
		for range 3 { // and again, on the kept state
			if err := p.Check(c); err != nil {
				t.Fatalf("an idle, open connection: %v", err)
			}
		}
		if allocs := testing.AllocsPerRun(10, func() { p.Check(c) }); allocs != 0 {
			t.Errorf("a repeated check allocates %v times", allocs)
		}
	})
	t.Run("closed", func(t *testing.T) {
		c, s := pair(t)
		var p Probe
		s.Close()
		if err := eventually(t, &p, c); !errors.Is(err, io.EOF) {
			t.Errorf("closed by the peer: %v, want EOF", err)
		}
	})
	t.Run("stray bytes", func(t *testing.T) {
		c, s := pair(t)
		var p Probe
		if _, err := s.Write([]byte("HTTP/1.1 408 Request Timeout\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		if err := eventually(t, &p, c); !errors.Is(err, ErrStrayBytes) {
			t.Errorf("bytes while idle: %v, want ErrStrayBytes", err)
		}
	})
	t.Run("reset", func(t *testing.T) {
		c, s := pair(t)
		var p Probe
		s.(*net.TCPConn).SetLinger(0) // close with a RST
		s.Close()
		if err := eventually(t, &p, c); err == nil || errors.Is(err, ErrStrayBytes) {
			t.Errorf("reset by the peer: %v", err)
		}
	})
	t.Run("no socket", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		var p Probe
		if err := p.Check(a); err != nil {
			t.Errorf("a connection without a socket: %v, want it to pass", err)
		}
	})
}
