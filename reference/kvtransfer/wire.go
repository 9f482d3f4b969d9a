package kvtransfer

import (
	"bufio"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

const (
	magic        = "OKVT"
	version      = 1
	headerLen    = 12
	maxControl   = 64 << 10 // control frames are tiny; this bounds what a bad peer can make us allocate
	dataHdrLen   = 16
	nonceLen     = 32
	batchBytes   = 8 << 20 // one write deadline per batch: long enough for writev, short enough to notice a stalled peer
	protoContext = "omnipd-kvtransfer/1"
)

// Frame types.
const (
	frameHello   byte = 1
	frameRequest byte = 2
	frameAccept  byte = 3
	frameError   byte = 4
	frameData    byte = 5
	frameAck     byte = 6
	frameDone    byte = 7
	// frameDataShared answers a request that asked for shared memory: the
	// data header, then where each block lies in the producer's region and
	// its generation.
	frameDataShared byte = 8
	// frameNotify names leases the consumer copied on their tickets, on a
	// connection opened for that with op "notify".
	frameNotify byte = 9
)

// Request ops.
const (
	opPull    = "pull"
	opPush    = "push"
	opRelease = "release"
	opNotify  = "notify"
)

// Error codes carried by ERROR frames; each maps to one sentinel.
var codeErrors = map[string]error{
	"unknown_transfer": ErrUnknownTransfer,
	"engine_mismatch":  ErrEngineMismatch,
	"auth":             ErrAuth,
	"shape":            ErrShape,
	"block_count":      ErrBlockCount,
	"busy":             ErrBusy,
	"protocol":         ErrProtocol,
}

func codeOf(err error) string {
	for code, sentinel := range codeErrors {
		if errors.Is(err, sentinel) {
			return code
		}
	}
	return "protocol"
}

type helloMsg struct {
	Nonce []byte `json:"nonce"`
	// SharedMemory is where a consumer on the same host can map the
	// producer's blocks; absent when the producer has no region to offer.
	SharedMemory *sharedAdvert `json:"shm,omitempty"`
}

// sharedAdvert names the producer's region: the descriptor it is open under
// in the producer's process, and what its header must say.
type sharedAdvert struct {
	PID  int    `json:"pid"`
	FD   int    `json:"fd"`
	ID   []byte `json:"id"`
	Size int64  `json:"size"` // of the whole file, header included
}

type requestMsg struct {
	Op         string `json:"op"`
	Key        string `json:"key"`
	EngineID   string `json:"engine_id,omitempty"`
	Blocks     int    `json:"blocks,omitempty"`
	BlockBytes int    `json:"block_bytes,omitempty"`
	Shape      string `json:"shape,omitempty"`
	ByteOrder  string `json:"byte_order,omitempty"`
	Nonce      []byte `json:"nonce"`
	MAC        []byte `json:"mac,omitempty"`
	// SharedMemory: the consumer has the region its hello advertised
	// mapped, so block offsets in it serve instead of the bytes.
	SharedMemory bool `json:"shm,omitempty"`
}

type acceptMsg struct {
	MAC []byte `json:"mac,omitempty"`
}

type errorMsg struct {
	Code    string `json:"code"`
	Message string `json:"msg"`
}

// refusal is an ERROR frame received from the producer. It is kept apart from
// local IO errors so that a cancelled context does not hide why the producer
// said no.
type refusal struct {
	sentinel error
	msg      string
}

func (r *refusal) Error() string { return "refused by producer: " + r.msg }
func (r *refusal) Unwrap() error { return r.sentinel }

func refusalFrom(payload []byte) error {
	var m errorMsg
	if err := json.Unmarshal(payload, &m); err != nil {
		return fmt.Errorf("%w: undecodable error frame: %v", ErrProtocol, err)
	}
	sentinel, ok := codeErrors[m.Code]
	if !ok {
		sentinel = ErrProtocol
	}
	return &refusal{sentinel: sentinel, msg: m.Message}
}

// nativeByteOrder names how this machine lays out a float32 in memory, which
// is how blocks travel.
func nativeByteOrder() string {
	if binary.NativeEndian.Uint16([]byte{1, 0}) == 1 {
		return "little"
	}
	return "big"
}

func putHeader(b []byte, typ byte, n int) {
	copy(b[0:4], magic)
	b[4] = version
	b[5] = typ
	b[6], b[7] = 0, 0
	binary.BigEndian.PutUint32(b[8:12], uint32(n))
}

// writeFrame writes header and payload in one Write so a frame is one segment.
func writeFrame(w io.Writer, typ byte, payload []byte) error {
	b := make([]byte, headerLen+len(payload))
	putHeader(b, typ, len(payload))
	copy(b[headerLen:], payload)
	_, err := w.Write(b)
	return err
}

func writeJSON(w io.Writer, typ byte, v any) error {
	b, err := appendJSONFrame(nil, typ, v)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// appendJSONFrame appends v as a control frame to b, so that frames owed to
// the peer can leave together in one write.
func appendJSONFrame(b []byte, typ byte, v any) ([]byte, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if len(payload) > maxControl {
		return nil, fmt.Errorf("%w: control frame of %d bytes exceeds %d", ErrProtocol, len(payload), maxControl)
	}
	n := len(b)
	b = append(b, make([]byte, headerLen)...)
	putHeader(b[n:], typ, len(payload))
	return append(b, payload...), nil
}

// frameConn is a kvtransfer connection whose reads go through a small
// buffer. Peers send control frames in pairs — a pull's DONE with the next
// hello, an ACCEPT with the block offsets — which one read then brings in,
// where reading each frame's header and payload straight from the socket
// took a system call apiece.
type frameConn struct {
	net.Conn
	br *bufio.Reader
}

// frameBufLen holds the control frames of a pull of a few hundred blocks.
const frameBufLen = 4 << 10

func newFrameConn(c net.Conn) *frameConn {
	return &frameConn{Conn: c, br: bufio.NewReaderSize(c, frameBufLen)}
}

func (c *frameConn) Read(p []byte) (int, error) { return c.br.Read(p) }

// socket is the connection under c when c is a frameConn, for net.Buffers:
// it writes with one writev only to the net package's own connections, and
// with a write per buffer to anything that wraps them.
func socket(c net.Conn) net.Conn {
	if fc, ok := c.(*frameConn); ok {
		return fc.Conn
	}
	return c
}

// readBuffers fills bufs in order, first with the bytes the buffer already
// holds (the start of the blocks that followed a DATA header), then
// straight from the socket with the package's readBuffers. It returns the
// bytes read before an error.
func (c *frameConn) readBuffers(bufs [][]byte) (int, error) {
	got := 0
	for len(bufs) > 0 && c.br.Buffered() > 0 {
		n, _ := c.br.Read(bufs[0]) // from the buffer: no system call
		got += n
		if n < len(bufs[0]) {
			bufs = append([][]byte{bufs[0][n:]}, bufs[1:]...)
		} else {
			bufs = bufs[1:]
		}
	}
	if len(bufs) == 0 {
		return got, nil
	}
	n, err := readBuffers(c.Conn, bufs)
	return got + n, err
}

// doneFrame is the empty DONE frame that ends a transfer.
var doneFrame = func() []byte {
	b := make([]byte, headerLen)
	putHeader(b, frameDone, 0)
	return b
}()

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// readFrame reads one frame, refusing anything that is not ours or is larger
// than maxControl before allocating for it.
func readFrame(r io.Reader) (typ byte, payload []byte, err error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	if string(h[0:4]) != magic {
		return 0, nil, fmt.Errorf("%w: bad magic %q: not an omnipd kvtransfer peer", ErrProtocol, h[0:4])
	}
	if h[4] != version {
		return 0, nil, fmt.Errorf("%w: peer speaks version %d, want %d", ErrProtocol, h[4], version)
	}
	n := binary.BigEndian.Uint32(h[8:12])
	if n > maxControl {
		return 0, nil, fmt.Errorf("%w: frame of %d bytes exceeds %d", ErrProtocol, n, maxControl)
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, err
	}
	return h[5], payload, nil
}

// readJSON reads a frame of type want into v. An ERROR frame becomes the
// producer's refusal.
func readJSON(r io.Reader, want byte, v any) error {
	typ, payload, err := readFrame(r)
	if err != nil {
		return err
	}
	if typ == frameError {
		return refusalFrom(payload)
	}
	if typ != want {
		return fmt.Errorf("%w: got frame type %d, want %d", ErrProtocol, typ, want)
	}
	if err := json.Unmarshal(payload, v); err != nil {
		return fmt.Errorf("%w: frame type %d: %v", ErrProtocol, typ, err)
	}
	return nil
}

type dataHeader struct {
	blocks, blockBytes uint32
	numTokens          uint64
}

func (d dataHeader) bytes() []byte {
	var b [dataHdrLen]byte
	binary.BigEndian.PutUint32(b[0:4], d.blocks)
	binary.BigEndian.PutUint32(b[4:8], d.blockBytes)
	binary.BigEndian.PutUint64(b[8:16], d.numTokens)
	return b[:]
}

func parseDataHeader(b []byte) (dataHeader, error) {
	if len(b) != dataHdrLen {
		return dataHeader{}, fmt.Errorf("%w: data header of %d bytes, want %d", ErrProtocol, len(b), dataHdrLen)
	}
	return dataHeader{
		blocks:     binary.BigEndian.Uint32(b[0:4]),
		blockBytes: binary.BigEndian.Uint32(b[4:8]),
		numTokens:  binary.BigEndian.Uint64(b[8:16]),
	}, nil
}

// sharedBlock is one block of a DATA_SHM frame: where it lies in the
// producer's region, and its generation counter as it read when the lease
// was checked out for this transfer.
type sharedBlock struct {
	offset, generation uint64
}

// sharedBlockLen is a sharedBlock's size on the wire: offset, then
// generation, each a big-endian uint64.
const sharedBlockLen = 16

// appendSharedBlock appends one block of a DATA_SHM payload, which is the
// data header and then one of these per block.
func appendSharedBlock(b []byte, blk sharedBlock) []byte {
	b = binary.BigEndian.AppendUint64(b, blk.offset)
	return binary.BigEndian.AppendUint64(b, blk.generation)
}

// parseSharedData splits a DATA_SHM payload into its header and its
// blocks, which the caller bounds-checks before it uses them.
func parseSharedData(b []byte) (dataHeader, []sharedBlock, error) {
	if len(b) < dataHdrLen {
		return dataHeader{}, nil, fmt.Errorf("%w: shared data frame of %d bytes", ErrProtocol, len(b))
	}
	d, err := parseDataHeader(b[:dataHdrLen])
	if err != nil {
		return dataHeader{}, nil, err
	}
	rest := b[dataHdrLen:]
	if uint64(len(rest)) != sharedBlockLen*uint64(d.blocks) {
		return dataHeader{}, nil, fmt.Errorf("%w: shared data frame has %d bytes of block places for %d blocks", ErrProtocol, len(rest), d.blocks)
	}
	blocks := make([]sharedBlock, d.blocks)
	for i := range blocks {
		blocks[i] = sharedBlock{
			offset:     binary.BigEndian.Uint64(rest[sharedBlockLen*i:]),
			generation: binary.BigEndian.Uint64(rest[sharedBlockLen*i+8:]),
		}
	}
	return d, blocks, nil
}

// maxSharedBlocks is how many blocks fit in one DATA_SHM frame; a lease of
// more blocks goes over TCP.
const maxSharedBlocks = (maxControl - dataHdrLen) / sharedBlockLen

// mac computes HMAC-SHA256 over the role and length-prefixed fields, so no
// two different field lists share an input and a consumer proof can never be
// reflected back as a producer proof.
func mac(secret, role string, fields ...[]byte) []byte {
	h := hmac.New(sha256.New, []byte(secret))
	var n [4]byte
	for _, f := range append([][]byte{[]byte(protoContext), []byte(role)}, fields...) {
		binary.BigEndian.PutUint32(n[:], uint32(len(f)))
		h.Write(n[:])
		h.Write(f)
	}
	return h.Sum(nil)
}

func consumerMAC(secret string, serverNonce []byte, r *requestMsg) []byte {
	return mac(secret, "consumer", serverNonce, r.Nonce, []byte(r.Op), []byte(r.Key), []byte(r.EngineID))
}

func producerMAC(secret string, serverNonce, clientNonce []byte, key string) []byte {
	return mac(secret, "producer", serverNonce, clientNonce, []byte(key))
}

// aLongTimeAgo is a deadline in the past: setting it makes a blocked read
// return at once, which is how Export wakes a waiting push handler.
var aLongTimeAgo = time.Unix(1, 0)
