package kvnotice

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
)

// Listener is the PULL end of LMCache's proxy socket: it accepts the PD
// senders' ZMQ PUSH connections (ZMTP 3.x, NULL security: LMCache sets no
// mechanism), reads each ProxyNotif and records it on Board. Only what that
// one exchange needs is implemented: the greeting, the READY handshake and
// single-frame messages; other commands are ignored.
type Listener struct {
	Board  *Board
	Logger *slog.Logger // nil: slog.Default()
}

// maxFrame bounds one frame: a ProxyNotif is a few dozen bytes.
const maxFrame = 1 << 16

// Serve accepts connections on ln until ctx ends or ln fails, and closes ln
// and every connection before it returns.
func (l *Listener) Serve(ctx context.Context, ln net.Listener) error {
	log := l.Logger
	if log == nil {
		log = slog.Default()
	}
	var wg sync.WaitGroup
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	defer func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.serveConn(c); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				log.Warn("kv done-notice connection ended", "remote", c.RemoteAddr().String(), "err", err)
			}
			c.Close()
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
		}()
	}
}

func greeting() []byte {
	g := make([]byte, 64)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 0
	copy(g[12:32], "NULL")
	g[32] = 1 // as-server: we bind
	return g
}

func (l *Listener) serveConn(c net.Conn) error {
	if _, err := c.Write(greeting()); err != nil {
		return err
	}
	r := bufio.NewReader(c)
	var peer [64]byte
	if _, err := io.ReadFull(r, peer[:]); err != nil {
		return err
	}
	if peer[0] != 0xff || peer[9] != 0x7f || peer[10] < 3 {
		return fmt.Errorf("not a ZMTP 3 peer")
	}
	if mech := string(bytes.TrimRight(peer[12:32], "\x00")); mech != "NULL" {
		return fmt.Errorf("security mechanism %q; only NULL is served", mech)
	}
	if _, err := c.Write(command("READY", "Socket-Type", "PULL")); err != nil {
		return err
	}
	ready := false
	for {
		flags, body, err := readFrame(r)
		if err != nil {
			return err
		}
		if flags&0x04 != 0 {
			name, props := parseCommand(body)
			switch name {
			case "READY":
				if t := props["socket-type"]; t != "PUSH" {
					return fmt.Errorf("peer socket type %q; want PUSH", t)
				}
				ready = true
			case "ERROR":
				return fmt.Errorf("peer error %q", props[""])
			}
			continue
		}
		if !ready {
			return fmt.Errorf("message before the READY handshake")
		}
		id, err := proxyNotifID(body)
		if err != nil {
			return err
		}
		l.Board.Done(id)
	}
}

func command(name string, kv ...string) []byte {
	var body bytes.Buffer
	body.WriteByte(byte(len(name)))
	body.WriteString(name)
	for i := 0; i+1 < len(kv); i += 2 {
		body.WriteByte(byte(len(kv[i])))
		body.WriteString(kv[i])
		binary.Write(&body, binary.BigEndian, uint32(len(kv[i+1])))
		body.WriteString(kv[i+1])
	}
	return append([]byte{0x04, byte(body.Len())}, body.Bytes()...)
}

func readFrame(r *bufio.Reader) (flags byte, body []byte, err error) {
	flags, err = r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	var n uint64
	if flags&0x02 != 0 {
		var b [8]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(b[:])
	} else {
		b, err := r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		n = uint64(b)
	}
	if n > maxFrame {
		return 0, nil, fmt.Errorf("frame of %d bytes", n)
	}
	body = make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, err
	}
	if flags&0x01 != 0 && flags&0x04 == 0 {
		return 0, nil, fmt.Errorf("multi-frame message; a ProxyNotif is one frame")
	}
	return flags, body, nil
}

// parseCommand splits a command body into its name and its properties
// (names lowercased: ZMTP property names are case-insensitive). An ERROR's
// reason is under "".
func parseCommand(b []byte) (string, map[string]string) {
	props := map[string]string{}
	if len(b) < 1 || len(b) < 1+int(b[0]) {
		return "", props
	}
	name := string(b[1 : 1+b[0]])
	b = b[1+b[0]:]
	if name == "ERROR" && len(b) >= 1 && len(b) >= 1+int(b[0]) {
		props[""] = string(b[1 : 1+b[0]])
		return name, props
	}
	for len(b) > 0 {
		kn := int(b[0])
		if len(b) < 1+kn+4 {
			break
		}
		k := string(bytes.ToLower(b[1 : 1+kn]))
		vn := int(binary.BigEndian.Uint32(b[1+kn:]))
		b = b[1+kn+4:]
		if len(b) < vn {
			break
		}
		props[k] = string(b[:vn])
		b = b[vn:]
	}
	return name, props
}

// proxyNotifID reads the req_id of an LMCache ProxyNotif: a msgspec tagged
// struct, msgpack-encoded as a map {"type": "ProxyNotif", "req_id": id}.
func proxyNotifID(b []byte) (string, error) {
	m, err := msgpackStringMap(b)
	if err != nil {
		return "", fmt.Errorf("done notice: %w", err)
	}
	if m["type"] != "ProxyNotif" || m["req_id"] == "" {
		return "", fmt.Errorf("done notice: %v is not a ProxyNotif", m)
	}
	return m["req_id"], nil
}

// msgpackStringMap decodes a msgpack map whose keys and values are strings.
func msgpackStringMap(b []byte) (map[string]string, error) {
	if len(b) == 0 {
		return nil, errors.New("empty message")
	}
	var n int
	switch t := b[0]; {
	case t&0xf0 == 0x80:
		n, b = int(t&0x0f), b[1:]
	case t == 0xde && len(b) >= 3:
		n, b = int(binary.BigEndian.Uint16(b[1:])), b[3:]
	default:
		return nil, fmt.Errorf("msgpack type 0x%02x; want a map", t)
	}
	m := make(map[string]string, n)
	for range n {
		k, rest, err := msgpackString(b)
		if err != nil {
			return nil, err
		}
		v, rest, err := msgpackString(rest)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		m[k], b = v, rest
	}
	return m, nil
}

func msgpackString(b []byte) (string, []byte, error) {
	if len(b) == 0 {
		return "", nil, io.ErrUnexpectedEOF
	}
	var n, h int
	switch t := b[0]; {
	case t&0xe0 == 0xa0:
		n, h = int(t&0x1f), 1
	case t == 0xd9 && len(b) >= 2:
		n, h = int(b[1]), 2
	case t == 0xda && len(b) >= 3:
		n, h = int(binary.BigEndian.Uint16(b[1:])), 3
	case t == 0xdb && len(b) >= 5:
		n, h = int(binary.BigEndian.Uint32(b[1:])), 5
	default:
		return "", nil, fmt.Errorf("msgpack type 0x%02x; want a string", t)
	}
	if len(b) < h+n {
		return "", nil, io.ErrUnexpectedEOF
	}
	return string(b[h : h+n]), b[h+n:], nil
}
