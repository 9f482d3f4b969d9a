package testbed

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// echo serves a loopback echo server until the test ends.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

func TestProxyStallsAndCuts(t *testing.T) {
	p, err := NewProxy(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 5)
	roundTrip := func(msg string) error {
		if _, err := c.Write([]byte(msg)); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, err := io.ReadFull(c, buf)
		return err
	}
	if err := roundTrip("hello"); err != nil || string(buf) != "hello" {
		t.Fatalf("through the proxy: %q %v", buf, err)
	}
	p.StallResponses()
	if err := roundTrip("stall"); err == nil {
		t.Fatal("an answer came through a stalled proxy")
	}
	p.Resume()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "stall" {
		t.Fatalf("held bytes after Resume: %q %v", buf, err)
	}

	p.CutNext(3)
	cut, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer cut.Close()
	cut.Write([]byte("abcdef"))
	cut.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, _ := io.ReadAll(cut)
	if !bytes.Equal(got, []byte("abc")) || p.Cuts() != 1 {
		t.Errorf("cut connection delivered %q (%d cuts), want \"abc\" then the end", got, p.Cuts())
	}
	if err := roundTrip("again"); err != nil || string(buf) != "again" {
		t.Errorf("the cut is for one connection only: %q %v", buf, err)
	}
}
