package testbed

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
)

// Proxy is a loopback TCP proxy in front of one port: the network between
// two parts of the deployment, which a test can stall (bytes stop moving,
// connections stay open) or cut (both ends closed after a number of bytes).
type Proxy struct {
	target string
	ln     net.Listener

	mu        sync.Mutex
	pipes     map[*pipe]struct{}
	stallUp   bool          // client to target held back
	stallDown bool          // target to client held back
	resumed   chan struct{} // closed (and replaced) when a stall ends
	cutNext   int64         // >0: the next connection is cut after this many bytes from the target
	closed    bool
	wg        sync.WaitGroup
	accepted  atomic.Int64
	cuts      atomic.Int64
	bytesUp   atomic.Int64
	bytesDown atomic.Int64
}

// pipe is one proxied connection pair.
type pipe struct {
	client, target net.Conn
	cutAfter       int64 // 0: never
	done           chan struct{}
	once           sync.Once
}

func (p *pipe) close() {
	p.once.Do(func() {
		close(p.done)
		p.client.Close()
		p.target.Close()
	})
}

// NewProxy listens on an ephemeral loopback port and forwards every
// connection to target.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("testbed: proxy for %s: %w", target, err)
	}
	p := &Proxy{target: target, ln: ln, pipes: map[*pipe]struct{}{}, resumed: make(chan struct{})}
	p.wg.Go(p.accept)
	return p, nil
}

// Addr is the proxy's "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL is the proxy's address as an http:// base URL.
func (p *Proxy) URL() string { return "http://" + p.Addr() }

// Stall stops forwarding in both directions. Connections stay open and new
// ones are accepted; nothing moves until Resume.
func (p *Proxy) Stall() { p.stall(true, true) }

// StallResponses stops forwarding from the target to its clients only:
// requests still arrive, answers are held back.
func (p *Proxy) StallResponses() { p.stall(false, true) }

func (p *Proxy) stall(up, down bool) {
	p.mu.Lock()
	p.stallUp, p.stallDown = up, down
	p.mu.Unlock()
}

// Resume ends a stall; held bytes move on.
func (p *Proxy) Resume() {
	p.mu.Lock()
	p.stallUp, p.stallDown = false, false
	close(p.resumed)
	p.resumed = make(chan struct{})
	p.mu.Unlock()
}

// CutNext makes the next connection accepted end abruptly — both sides
// closed — once n bytes have gone from the target to the client.
func (p *Proxy) CutNext(n int64) {
	p.mu.Lock()
	p.cutNext = n
	p.mu.Unlock()
}

// Accepted is how many connections the proxy has accepted.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// Cuts is how many connections CutNext has cut.
func (p *Proxy) Cuts() int64 { return p.cuts.Load() }

// BytesUp and BytesDown count bytes forwarded to and from the target.
func (p *Proxy) BytesUp() int64   { return p.bytesUp.Load() }
func (p *Proxy) BytesDown() int64 { return p.bytesDown.Load() }

// Open is the number of connection pairs open now.
func (p *Proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pipes)
}

// CloseOpen closes every connection pair open now, as a restart of the
// target would, and goes on accepting new ones.
func (p *Proxy) CloseOpen() {
	p.mu.Lock()
	pipes := make([]*pipe, 0, len(p.pipes))
	for pp := range p.pipes {
		pipes = append(pipes, pp)
	}
	p.mu.Unlock()
	for _, pp := range pipes {
		pp.close()
	}
}

// Close stops accepting, closes every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return
	}
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.CloseOpen()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.accepted.Add(1)
		t, err := net.Dial("tcp", p.target)
		if err != nil {
			// The target is gone: so is the connection, as a client
			// reaching a dead host through a load balancer sees it.
			c.Close()
			continue
		}
		pp := &pipe{client: c, target: t, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			pp.close()
			return
		}
		pp.cutAfter, p.cutNext = p.cutNext, 0
		p.pipes[pp] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pump(pp, c, t, true)
		go p.pump(pp, t, c, false)
	}
}

// pump copies src to dst until either end closes, honouring stalls and
// the pipe's cut.
func (p *Proxy) pump(pp *pipe, src, dst net.Conn, up bool) {
	defer p.wg.Done()
	defer func() {
		pp.close()
		p.mu.Lock()
		delete(p.pipes, pp)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	var sent int64
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate(pp, up) {
				return
			}
			chunk := buf[:n]
			cut := !up && pp.cutAfter > 0 && sent+int64(n) >= pp.cutAfter
			if cut {
				chunk = chunk[:pp.cutAfter-sent]
			}
			if _, werr := dst.Write(chunk); werr != nil {
				return
			}
			sent += int64(len(chunk))
			if up {
				p.bytesUp.Add(int64(len(chunk)))
			} else {
				p.bytesDown.Add(int64(len(chunk)))
			}
			if cut {
				p.cuts.Add(1)
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// gate waits while the direction is stalled; false when the pipe closed
// meanwhile.
func (p *Proxy) gate(pp *pipe, up bool) bool {
	for {
		p.mu.Lock()
		stalled := (up && p.stallUp) || (!up && p.stallDown)
		resumed := p.resumed
		p.mu.Unlock()
		if !stalled {
			return true
		}
		select {
		case <-resumed:
		case <-pp.done:
			return false
		}
	}
}
