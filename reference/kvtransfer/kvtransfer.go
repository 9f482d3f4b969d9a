// Package kvtransfer owns the reference engine's KV data path between a
// prefill worker and a decode worker: the producer exports the KV blocks of a
// finished prefill under a lease, and the consumer receives them into its own
// freshly allocated blocks over TCP — or, on the producer's host, copies them
// out of the producer's shared memory — either by pulling them (NIXL-shaped:
// the prefill has returned, the decode asks for its blocks) or by registering
// for them and having them pushed (Mooncake-shaped: the decode may arrive
// before the prefill has exported, and whichever side comes first waits).
//
// Blocks travel as raw bytes, straight from the producer's cache memory into
// the consumer's, with no per-element encoding. The bytes are float32 in the
// machine's byte order, so the handshake carries the byte order, the block
// size and an opaque shape string, and a mismatch is refused before any block
// moves. The producer frees its copies only after the consumer has
// acknowledged every byte; until then the blocks stay leased, and a lease
// that nobody claims or releases expires.
//
// # Shared memory on one host
//
// A producer whose cache lives in a SharedMemory region (SharedCacheStore;
// Linux only: a sealed memfd) names the region in its hellos: its pid, the
// descriptor, a random 128-bit id and the size. A consumer on the same host
// opens /proc/<pid>/fd/<fd> read-only, maps it, and checks the id in the
// region's header; once, per producer address and region. Then it asks for
// shared memory in its requests, and the producer answers with where the
// lease's blocks lie in the region instead of their bytes; the consumer
// copies each block from its mapping into its own, and nothing but control
// frames crosses TCP. If anything is in the way — another host or PID
// namespace, another user, another region under that descriptor or of
// another layout, a consumer or producer with Config.DisableSharedMemory,
// blocks smaller than 512 bytes — the transfer simply goes over TCP. The
// kernel lets only the producer's user (or root) open the descriptor, and
// they can read the producer's memory anyway, so the region exposes nothing
// new; the secret still guards every request.
//
// The region is a header page, a generation table and the blocks:
//
//	0     "OKVTSHM2", id (16 bytes), then big-endian u64s: the file's size, the
//	      table's offset, its number of counters, the offset of the block area;
//	      then the key tickets are signed with (32 bytes; zeros: no tickets)
//	4096  the generation table: one u64 counter (native byte order, updated
//	      atomically) per 512 bytes of block area, page-aligned
//	data  the blocks (the memory SharedMemory.Bytes returns), page-aligned
//
// A block of block_bytes at offset off has the counter at index
// (off-data)/block_bytes, so blocks that do not overlap never share one. The
// producer adds one to the counters of a lease's blocks whenever it frees
// them — after the ACK, on Release (at once, or once the stream it cut lets
// go), on expiry (a lease whose stream failed goes back to the table and
// expires), on Close — and always before the blocks go back to its cache. A
// consumer maps the region only if the table and the block area lie within
// it.
//
// This is what lets a transfer through shared memory end, like one over
// TCP, with the consumer's ACK: the consumer copies the blocks, then reads
// their counters, and if any differs from what the producer sent, the
// producer freed (and may have reused) that block while it was being
// copied, and the transfer fails with ErrUnknownTransfer instead of
// keeping the copy; otherwise it acks, and does not wait for the DONE.
//
// # Tickets: one-sided reads
//
// A pull through shared memory still asks the producer where the blocks
// lie. A producer with a region also signs that at export, in a ticket
// (Producer.Ticket): the region's id, the token count, each block's slot
// (its offset in the block area over the block size) and generation, and
// an HMAC-SHA256, cut to 128 bits, over them, the lease's key, the
// producer's engine id, the cache shape, the byte order and the block
// size, under the random key in the region's header, which only a process
// that can map the region can read. The ticket
// travels with the prefill's answer (kv_transfer_params.remote_shm), and
// a consumer that has the region mapped already (from an earlier pull from
// that producer) and finds that the ticket verifies copies the blocks and
// checks their generations as after a DATA_SHM, without a word to the
// producer: the way NIXL reads over RDMA. Then, in the background, it
// tells the producer which leases it may free: a connection per producer,
// opened like any other with a request of op "notify", carries NOTIFY
// frames, each naming one or more leases, with nothing in answer; the
// producer frees them as it would on an ack. The sender ends after the
// idle timeout, and Close sends what is queued. A lost notification leaves
// the lease to its expiry. A ticket that cannot be used — no mapping yet,
// another region, a signature that does not verify because anything it
// covers differs, another number of blocks — makes the consumer pull
// instead, and the pull says what is wrong. A forged ticket cannot steer a
// decode to blocks of other requests, and one replayed after its lease
// ended finds the generations moved.
//
// # Wire format
//
// Every frame starts with a 12-byte header: magic "OKVT", version (1 byte),
// type (1 byte), two reserved zero bytes, and the payload length (uint32,
// big-endian). Control payloads are compact JSON and at most 64 KiB.
//
//	producer → consumer  HELLO    {"nonce","shm"}                on accept, and after each completed request;
//	                              "shm": {"pid","fd","id","size"} when the producer has a region to offer
//	consumer → producer  REQUEST  {"op","key","engine_id","blocks","block_bytes","shape","byte_order","nonce","mac","shm"}
//	                              "shm": true when the consumer has the hello's region mapped
//	producer → consumer  ACCEPT   {"mac"}  or  ERROR {"code","msg"} and close
//	producer → consumer  DATA     16 bytes: blocks u32, block_bytes u32, num_tokens u64 (big-endian),
//	                              then blocks*block_bytes raw bytes, block after block, outside the frame
//	                  or DATA_SHM (type 8, when the request said "shm" and every block of the lease lies in the
//	                              region's block area) the same 16 bytes, then per block two u64s (big-endian):
//	                              its offset from the start of the region's file, and its generation counter as
//	                              the lease was checked out for this transfer; the consumer refuses any block not
//	                              wholly in the block area; a lease of more blocks than one frame can list (4095)
//	                              goes as DATA
//	consumer → producer  ACK      (empty); the producer frees its blocks only now
//	producer → consumer  DONE     (empty)
//	consumer → producer  NOTIFY   (type 9; after the ACCEPT of op "notify", any number, unanswered)
//	                              {"keys"}: leases copied on their tickets, to free
//
// A transfer is complete for the consumer once its ACK is sent — after a
// DATA_SHM, once the copy is done and the counters are checked: the DONE
// costs a round trip the decode need not wait for, so the consumer reads it
// at the start of a pooled connection's next pull (or never, if it closes
// the connection; the producer has read the ACK by the time it sends the
// DONE).
//
// Peers that predate shared memory interoperate: each side ignores JSON
// fields it does not know, and a producer sends DATA_SHM only to a request
// that asked for it.
//
// For op "push" the ACCEPT comes at once and the DATA (or an ERROR) when the
// key is exported; for op "release" the ACCEPT is the whole answer. For op
// "pull" the ACCEPT and the DATA leave in one write.
//
// A connection carries requests one after another: once a request has
// completed (DONE, or a release's ACCEPT), the producer sends the next HELLO
// with a fresh nonce in the same write, and the consumer may keep the
// connection idle for its next pull or push. An ERROR ends the connection.
// The consumer pools pull and push connections (a release runs in the
// background, on a connection of its own), at most Config.MaxIdleConns per
// producer for Config.IdleTimeout, and when a pooled connection turns out to
// have been closed before the producer answered, it retries once on a fresh
// one: the producer had not seen the request, so nothing happened there.
//
// With a secret configured the consumer's mac is HMAC-SHA256 over both
// nonces, the op, the key and the engine id, and the producer's mac is
// HMAC-SHA256 over both nonces and the key, so each side proves it knows the
// secret without sending it, and neither proof can be replayed on another
// connection or for another request on the same connection.
package kvtransfer

import (
	"errors"
	"log/slog"
	"net"
	"time"
)

// Error classes. Every error this package returns wraps at most one of these
// with context; match them with errors.Is.
var (
	// ErrUnknownTransfer: the producer holds no lease under the key (never
	// exported, already claimed, released or expired), or freed it while
	// the consumer copied its blocks out of shared memory, or a push waited
	// longer than the producer's lease duration for the export.
	ErrUnknownTransfer = errors.New("kvtransfer: unknown transfer")
	// ErrEngineMismatch: the producer is not the engine the consumer expected.
	ErrEngineMismatch = errors.New("kvtransfer: engine id mismatch")
	// ErrAuth: a peer failed to prove it knows the deployment secret.
	ErrAuth = errors.New("kvtransfer: authentication failed")
	// ErrShape: the two sides disagree on the cache geometry, block size or
	// byte order, so the raw bytes would mean different things.
	ErrShape = errors.New("kvtransfer: shape mismatch")
	// ErrBlockCount: the consumer's destination has a different number of
	// blocks than the producer exported.
	ErrBlockCount = errors.New("kvtransfer: block count mismatch")
	// ErrBusy: the transfer is already being streamed to another consumer,
	// or another consumer is already waiting for it. A retry may succeed once
	// the other connection is gone.
	ErrBusy = errors.New("kvtransfer: transfer busy")
	// ErrProtocol: the peer broke the wire protocol (bad magic, version,
	// frame type or length).
	ErrProtocol = errors.New("kvtransfer: protocol error")
	// ErrInvalid: the caller passed invalid arguments (empty key, bad or
	// duplicate block ids, key already exported). The caller still owns any
	// blocks it passed.
	ErrInvalid = errors.New("kvtransfer: invalid argument")
	// ErrClosed: the producer is closed.
	ErrClosed = errors.New("kvtransfer: producer closed")
	// ErrRevoked: Export of a key Revoke was called for before the export:
	// the request it belongs to is gone. The caller still owns the blocks.
	ErrRevoked = errors.New("kvtransfer: transfer revoked")
)

// BlockStore is the engine's cache as the data path sees it. The views
// returned by Block must be BlockBytes long and stay valid while the block
// is allocated. *kvcache.Cache satisfies it through CacheStore.
type BlockStore interface {
	BlockBytes() int
	Block(id int) []byte // a view of the block's memory
	Free(ids []int)      // return blocks to the pool (producer side, when a lease ends)
}

// blockCounter is an optional BlockStore capability: when present, block ids
// are range-checked before they reach Block, which would otherwise panic.
type blockCounter interface {
	NumBlocks() int
}

// Config configures either side. The zero value needs only an EngineID on
// the producer.
type Config struct {
	EngineID      string
	ListenAddr    string        // producer's side channel, "127.0.0.1:0" style; default 127.0.0.1:0
	Secret        string        // deployment secret; when set, peers must prove they know it; when empty, no auth
	LeaseDuration time.Duration // how long exported blocks wait to be claimed; default 30s
	Shape         string        // opaque geometry (e.g. fmt.Sprint of a kvcache.Shape) both sides must agree on
	// Listener, when set, is the producer's side channel already bound, and
	// ListenAddr is ignored: a process that picked the port and holds it
	// (omnipd serve, for the workers it starts) hands it over, so that no
	// other process can take it between the pick and the producer. The
	// producer owns it from NewProducer on, which closes it on failure too.
	Listener net.Listener
	// IOTimeout bounds each network step: the handshake, a batch of a few
	// MiB of blocks, the final ack. A peer that stalls longer is dropped.
	// Default 30s.
	IOTimeout time.Duration
	// IdleTimeout is how long a consumer keeps an idle connection to a
	// producer for its next pull, and (plus IOTimeout) how long a producer
	// waits on one for the next request. Default 2s: under any steady load
	// connections stay warm, and an idle deployment soon holds none.
	IdleTimeout time.Duration
	// MaxIdleConns bounds the consumer's idle connections per producer
	// address; beyond it a finished connection is closed. Default 16; a
	// negative value turns reuse off (a connection per transfer).
	MaxIdleConns int
	// DisableSharedMemory keeps blocks on TCP even between a producer and a
	// consumer on one host: a producer stops offering its region, a
	// consumer stops mapping producers' regions.
	DisableSharedMemory bool
	Clock               func() time.Time // lease expiry reads time here; time.Now when nil
	Logger              *slog.Logger     // discards when nil
}

const (
	defaultLeaseDuration = 30 * time.Second
	defaultIOTimeout     = 30 * time.Second
	defaultIdleTimeout   = 2 * time.Second
	defaultMaxIdleConns  = 16
	defaultListenAddr    = "127.0.0.1:0"
	maxKeyLen            = 1024
)

func (c Config) withDefaults() Config {
	if c.ListenAddr == "" {
		c.ListenAddr = defaultListenAddr
	}
	if c.LeaseDuration <= 0 {
		c.LeaseDuration = defaultLeaseDuration
	}
	if c.IOTimeout <= 0 {
		c.IOTimeout = defaultIOTimeout
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = defaultIdleTimeout
	}
	if c.MaxIdleConns == 0 {
		c.MaxIdleConns = defaultMaxIdleConns
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}
