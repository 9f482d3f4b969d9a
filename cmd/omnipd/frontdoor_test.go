package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// frontDoorServe starts omnipd serve with args on a free port and returns
// its base URL once it answers /health; it is stopped with SIGTERM when
// the test ends.
func frontDoorServe(t *testing.T, bin string, args ...string) string {
	t.Helper()
	return startServe(t, bin, append([]string{"--port", "0"}, args...)...).url(t)
}

// Bodies trickled a byte at a time over 200 connections — far more than
// --max-concurrent — hold no request slot of the real binary: real
// requests keep succeeding while they trickle.
func TestServeSlowBodiesDoNotLockOthersOut(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	const slots, slow = 8, 200
	url := frontDoorServe(t, buildBinary(t), "--max-concurrent", fmt.Sprint(slots))
	host := strings.TrimPrefix(url, "http://")

	stop := make(chan struct{})
	started := make(chan error, slow)
	var wg sync.WaitGroup
	for range slow {
		wg.Go(func() { trickle(host, stop, started) })
	}
	defer func() { close(stop); wg.Wait() }()
	for range slow {
		if err := <-started; err != nil {
			t.Fatalf("slow connection: %v", err)
		}
	}
	client := &http.Client{Timeout: 30 * time.Second}
	for i := range 4 {
		resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(
			fmt.Sprintf(`{"messages":[{"role":"user","content":"real request %d"}],"max_tokens":4,"modalities":["text"]}`, i)))
		if err != nil {
			t.Fatalf("request %d while %d bodies trickle: %v", i, slow, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d while %d bodies trickle (--max-concurrent %d): %d %s", i, slow, slots, resp.StatusCode, body)
		}
	}
}

// trickle sends a chat request's headers and then its body a byte every
// 100 ms until stop; it reports on started once the first body byte is out.
func trickle(host string, stop <-chan struct{}, started chan<- error) {
	c, err := net.DialTimeout("tcp", host, 10*time.Second)
	if err != nil {
		started <- err
		return
	}
	defer c.Close()
	body := `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 400) + `"}]}`
	if _, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: omnipd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%c", len(body), body[0]); err != nil {
		started <- err
		return
	}
	started <- nil
	for i := 1; i < len(body); i++ {
		select {
		case <-stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
		if _, err := c.Write([]byte{body[i]}); err != nil {
			return // the server hung up (its body timeout): its right
		}
	}
}

// keepAliveFlag is the serve flag that sets the idle keep-alive timeout.
const keepAliveFlag = "--keep-alive-timeout"

// Idle keep-alive connections to the real binary are closed after the
// keep-alive timeout, here set short.
func TestServeClosesIdleConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	url := frontDoorServe(t, bin, keepAliveFlag, "300ms")
	const idle = 50
	conns := make([]net.Conn, 0, idle)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range idle {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(url, "http://"), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		fmt.Fprintf(c, "GET /v1/models HTTP/1.1\r\nHost: omnipd\r\n\r\n")
		br := bufio.NewReader(c)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		// Then idle: the server must close it, within the guard.
		defer func(c net.Conn, br *bufio.Reader) {
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := br.ReadByte(); err != io.EOF {
				t.Errorf("connection %d: an idle keep-alive connection should be closed: read %v", i, err)
			}
		}(c, br)
	}
}
