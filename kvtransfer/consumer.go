package kvtransfer

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"
)

// Consumer is the decode side. It holds no state between calls and starts no
// goroutines of its own; each call is one connection.
type Consumer struct {
	cfg   Config
	store BlockStore
	log   *slog.Logger
}

// NewConsumer makes a consumer that receives into store. cfg.Secret and
// cfg.Shape are presented to producers; cfg.IOTimeout bounds each network
// step and cfg.LeaseDuration (plus IOTimeout) bounds how long a push waits
// for the export, in addition to the caller's context.
func NewConsumer(cfg Config, store BlockStore) *Consumer {
	cfg = cfg.withDefaults()
	return &Consumer{cfg: cfg, store: store, log: cfg.Logger.With("engine_id", cfg.EngineID)}
}

// Pull (NIXL-shaped) fetches the blocks exported under key from the producer
// at addr into dst, which must hold as many blocks as were exported, and
// returns how many token positions they hold. Success means dst holds every
// byte and the consumer has acknowledged them; the producer frees its copies
// on that ack, before it answers (if the ack or the answer is lost, the
// transfer still succeeds here and the producer's lease expiry frees them).
// On any failure, including ctx ending mid-transfer, the producer's lease
// stays in place for a retry, a release or expiry, and the contents of dst
// are undefined.
func (c *Consumer) Pull(ctx context.Context, addr, remoteEngineID, key string, dst []int) (numTokens int, err error) {
	return c.fetch(ctx, opPull, addr, remoteEngineID, key, dst)
}

// Receive (Mooncake-shaped) registers with the producer at addr for key and
// waits, until ctx ends, for the producer to export it and push the blocks
// into dst. It may be called before the prefill has run.
func (c *Consumer) Receive(ctx context.Context, addr, remoteEngineID, key string, dst []int) (numTokens int, err error) {
	return c.fetch(ctx, opPush, addr, remoteEngineID, key, dst)
}

// ReleaseRemote tells the producer to drop key's lease without transferring,
// for a request cancelled between prefill and decode.
func (c *Consumer) ReleaseRemote(ctx context.Context, addr, key string) error {
	_, err := c.fetch(ctx, opRelease, addr, "", key, nil)
	return err
}

func (c *Consumer) fetch(ctx context.Context, op, addr, engineID, key string, dst []int) (n int, err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("kvtransfer: %s %q from %s: %w", op, key, addr, err)
		}
	}()
	if err := checkKey(key); err != nil {
		return 0, err
	}
	if op != opRelease {
		if err := checkBlocks(c.store, dst); err != nil {
			return 0, err
		}
	}
	d := net.Dialer{Timeout: c.cfg.IOTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	// Closing the connection is what makes cancellation prompt: it unblocks
	// any read or write at once, and unlike a deadline it cannot be undone
	// by the next SetDeadline.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	n, err = c.exchange(conn, op, engineID, key, dst)
	if err != nil && ctx.Err() != nil {
		var r *refusal
		if !errors.As(err, &r) {
			return 0, ctx.Err()
		}
	}
	return n, err
}

func (c *Consumer) exchange(conn net.Conn, op, engineID, key string, dst []int) (int, error) {
	if err := conn.SetDeadline(time.Now().Add(c.cfg.IOTimeout)); err != nil {
		return 0, err
	}
	var h helloMsg
	if err := readJSON(conn, frameHello, &h); err != nil {
		return 0, fmt.Errorf("hello: %w", err)
	}
	if len(h.Nonce) != nonceLen {
		return 0, fmt.Errorf("%w: server nonce of %d bytes, want %d", ErrProtocol, len(h.Nonce), nonceLen)
	}
	req := requestMsg{Op: op, Key: key, EngineID: engineID, Nonce: make([]byte, nonceLen)}
	rand.Read(req.Nonce)
	if op != opRelease {
		req.Blocks = len(dst)
		req.BlockBytes = c.store.BlockBytes()
		req.Shape = c.cfg.Shape
		req.ByteOrder = nativeByteOrder()
	}
	if c.cfg.Secret != "" {
		req.MAC = consumerMAC(c.cfg.Secret, h.Nonce, &req)
	}
	if err := writeJSON(conn, frameRequest, req); err != nil {
		return 0, fmt.Errorf("request: %w", err)
	}
	var acc acceptMsg
	if err := readJSON(conn, frameAccept, &acc); err != nil {
		return 0, err
	}
	// Check the producer too: without this, anything listening at addr could
	// feed us blocks.
	if c.cfg.Secret != "" && !hmac.Equal(acc.MAC, producerMAC(c.cfg.Secret, h.Nonce, req.Nonce, key)) {
		return 0, fmt.Errorf("%w: producer did not prove it knows the secret", ErrAuth)
	}
	if op == opRelease {
		return 0, nil
	}

	if op == opPush {
		// The producer gives up on an export after its lease duration; this
		// bound only matters if it vanished without closing the connection.
		if err := conn.SetReadDeadline(time.Now().Add(c.cfg.LeaseDuration + c.cfg.IOTimeout)); err != nil {
			return 0, err
		}
	}
	typ, payload, err := readFrame(conn)
	switch {
	case err != nil:
		return 0, fmt.Errorf("data header: %w", err)
	case typ == frameError:
		return 0, refusalFrom(payload)
	case typ != frameData:
		return 0, fmt.Errorf("%w: got frame type %d, want data", ErrProtocol, typ)
	}
	dh, err := parseDataHeader(payload)
	if err != nil {
		return 0, err
	}
	if int(dh.blocks) != len(dst) {
		return 0, fmt.Errorf("%w: producer sends %d blocks, want %d", ErrBlockCount, dh.blocks, len(dst))
	}
	bb := c.store.BlockBytes()
	if int(dh.blockBytes) != bb {
		return 0, fmt.Errorf("%w: producer sends %d-byte blocks, want %d", ErrShape, dh.blockBytes, bb)
	}
	if dh.numTokens > uint64(maxInt) {
		return 0, fmt.Errorf("%w: num_tokens %d", ErrProtocol, dh.numTokens)
	}

	perBatch := max(1, batchBytes/bb)
	for i, id := range dst {
		if i%perBatch == 0 {
			if err := conn.SetReadDeadline(time.Now().Add(c.cfg.IOTimeout)); err != nil {
				return 0, err
			}
		}
		b := c.store.Block(id)
		if len(b) != bb {
			return 0, fmt.Errorf("block %d is %d bytes, store says %d", id, len(b), bb)
		}
		// Straight into the cache's memory: no staging buffer.
		if _, err := io.ReadFull(conn, b); err != nil {
			return 0, fmt.Errorf("block %d of %d: %w", i, len(dst), err)
		}
	}

	// From here dst is complete, so nothing turns this into a failure, not
	// even ctx ending: only the producer's free is in doubt, and its lease
	// expiry covers that.
	conn.SetDeadline(time.Now().Add(c.cfg.IOTimeout))
	if err := writeFrame(conn, frameAck, nil); err != nil {
		c.log.Warn("kvtransfer: ack not sent; producer frees on lease expiry", "key", key, "err", err)
		return int(dh.numTokens), nil
	}
	if typ, _, err := readFrame(conn); err != nil || typ != frameDone {
		c.log.Warn("kvtransfer: no done after ack; producer may free on lease expiry", "key", key, "err", err, "frame", typ)
	}
	return int(dh.numTokens), nil
}

const maxInt = int(^uint(0) >> 1)
