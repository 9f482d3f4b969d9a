// Package eccache owns the reference encoder cache of encoder
// disaggregation (E/P/D): an encoder worker keeps the rows its encoders
// made for a media item under the item's content hash, and a prefill worker
// fetches them by that key, worker to worker, instead of encoding — vLLM's
// EC connectors key encoder outputs by the item's multimodal hash the same
// way. An entry is read as often as asked (a request retried on another
// prefill fetches it again) and is held under leases, one per request that
// asked for it (the same item in two requests is one entry); it lives until
// its last lease is released (the requests ended) or its TTL runs out —
// on time, whether or not calls come to the store, until it is closed. A
// lease is released by name, so a request whose encoder answer never came
// still frees what the encoder kept for it. Len is the gauge that shows
// none are left.
package eccache

import (
	"bytes"
	"container/list"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/omnipd/omnipd/stageapi"
)

// Entry is one media item's encoder output: the rows its audio
// placeholders take and the rows its image or video placeholders take (a
// video heard with use_audio_in_video has both).
type Entry struct {
	Audio, Vision [][]float32
}

// Errors of the cache.
var (
	ErrNotFound = errors.New("eccache: no such entry (never stored, released or expired)")
	ErrAuth     = errors.New("eccache: unauthorized")
	ErrCorrupt  = errors.New("eccache: not an encoder cache entry")
	// ErrReleased: the lease was released before the outputs were kept
	// (the request ended while its encoder leg was on its way).
	ErrReleased = errors.New("eccache: lease already released")
	// ErrClosed: the store was closed (the worker is shutting down).
	ErrClosed = errors.New("eccache: store closed")
)

// Clock is the time a Store expires entries by: the time now, and a timer
// that calls f in its own goroutine once d has passed unless stopped
// first. Tests inject one they move by hand.
type Clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending call of Clock.AfterFunc; *time.Timer is one.
type Timer interface {
	// Stop cancels the call; false when it already ran or was stopped.
	Stop() bool
}

// systemClock is the real time.
type systemClock struct{}

func (systemClock) Now() time.Time                            { return time.Now() }
func (systemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

var _ Clock = systemClock{}

// Config configures a Store; the zero value works.
type Config struct {
	// TTL bounds how long an entry waits to be released (default 60 s).
	TTL time.Duration
	// Clock is the time entries expire by (default the system's).
	Clock Clock
}

// Store holds entries by key. Safe for concurrent use: one mutex guards
// it. Entries expire on time whether or not calls come — a timer is set for
// the soonest expiry while anything waits to expire — until Close.
type Store struct {
	cfg     Config
	mu      sync.Mutex
	entries map[string]*held
	leases  map[string]map[string]bool // lease → keys it holds
	// released remembers leases released before anything was kept under
	// them, until the TTL: a release can overtake the encoder leg it ends
	// (the leg stalled on its way), whose outputs are then not kept.
	released map[string]*list.Element
	// byExpiry (*held) and releasedByExpiry (*releasedLease) are in the
	// order they expire, soonest first: with one TTL for all, that is the
	// order of their last put or release, so a sweep looks at no more
	// than it frees.
	byExpiry, releasedByExpiry list.List
	// sweeper is the timer of the next sweep; nil when none is set.
	sweeper Timer
	closed  bool
}

type held struct {
	key     string
	entry   *Entry
	expires time.Time
	leases  map[string]bool
	// place is the entry's element in Store.byExpiry.
	place *list.Element
}

type releasedLease struct {
	lease string
	until time.Time
}

// NewStore makes a store.
func NewStore(cfg Config) *Store {
	if cfg.TTL <= 0 {
		cfg.TTL = 60 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = systemClock{}
	}
	return &Store{cfg: cfg, entries: map[string]*held{}, leases: map[string]map[string]bool{}, released: map[string]*list.Element{}}
}

// Put keeps e under key for lease, replacing the rows that were there (the
// same item encoded again gives the same rows) and adding lease to the
// entry's holders; its TTL starts again.
func (s *Store) Put(key, lease string, e *Entry) error {
	if key == "" || len(key) > 256 || lease == "" || len(lease) > 256 {
		return fmt.Errorf("eccache: invalid key %q or lease %q", key, lease)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	now := s.cfg.Clock.Now()
	s.sweepLocked(now)
	if _, gone := s.released[lease]; gone {
		return fmt.Errorf("%w: %q", ErrReleased, lease)
	}
	h, ok := s.entries[key]
	if !ok {
		h = &held{key: key, leases: map[string]bool{}}
		s.entries[key] = h
	} else {
		s.byExpiry.Remove(h.place)
	}
	h.entry, h.expires = e, now.Add(s.cfg.TTL)
	h.place = s.byExpiry.PushBack(h)
	h.leases[lease] = true
	if s.leases[lease] == nil {
		s.leases[lease] = map[string]bool{}
	}
	s.leases[lease][key] = true
	s.armLocked(now)
	return nil
}

// Release ends lease: the entries it alone held are freed. False when the
// lease holds nothing.
func (s *Store) Release(lease string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	now := s.cfg.Clock.Now()
	keys, ok := s.leases[lease]
	delete(s.leases, lease)
	if el, again := s.released[lease]; again {
		s.releasedByExpiry.Remove(el)
	}
	s.released[lease] = s.releasedByExpiry.PushBack(&releasedLease{lease: lease, until: now.Add(s.cfg.TTL)})
	for key := range keys {
		if h, ok := s.entries[key]; ok {
			delete(h.leases, lease)
			if len(h.leases) == 0 {
				s.removeLocked(h)
			}
		}
	}
	s.armLocked(now)
	return ok
}

// Get returns the entry under key, leaving it in place.
func (s *Store) Get(key string) (*Entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked(s.cfg.Clock.Now())
	h, ok := s.entries[key]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, key)
	}
	return h.entry, nil
}

// Len is the number of entries held; expired ones are freed first.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked(s.cfg.Clock.Now())
	return len(s.entries)
}

// Close frees every entry and stops the sweeps; the store keeps nothing
// afterwards (Put fails with ErrClosed). Safe to call more than once.
func (s *Store) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.sweeper != nil {
		s.sweeper.Stop()
		s.sweeper = nil
	}
	clear(s.entries)
	clear(s.leases)
	clear(s.released)
	s.byExpiry.Init()
	s.releasedByExpiry.Init()
}

// removeLocked frees h and takes it out of its leases.
func (s *Store) removeLocked(h *held) {
	delete(s.entries, h.key)
	s.byExpiry.Remove(h.place)
	for lease := range h.leases {
		delete(s.leases[lease], h.key)
		if len(s.leases[lease]) == 0 {
			delete(s.leases, lease)
		}
	}
}

// sweepLocked frees what expired by now, soonest first.
func (s *Store) sweepLocked(now time.Time) {
	for el := s.byExpiry.Front(); el != nil && !now.Before(el.Value.(*held).expires); el = s.byExpiry.Front() {
		s.removeLocked(el.Value.(*held))
	}
	for el := s.releasedByExpiry.Front(); el != nil && !now.Before(el.Value.(*releasedLease).until); el = s.releasedByExpiry.Front() {
		delete(s.released, el.Value.(*releasedLease).lease)
		s.releasedByExpiry.Remove(el)
	}
}

// armLocked sets the timer for the soonest expiry unless one is set. A set
// timer is never late for what comes after it: with one TTL for all, a
// later put or release expires no sooner than what the timer was set for.
func (s *Store) armLocked(now time.Time) {
	if s.closed || s.sweeper != nil {
		return
	}
	var next time.Time
	if el := s.byExpiry.Front(); el != nil {
		next = el.Value.(*held).expires
	}
	if el := s.releasedByExpiry.Front(); el != nil {
		if until := el.Value.(*releasedLease).until; next.IsZero() || until.Before(next) {
			next = until
		}
	}
	if next.IsZero() {
		return
	}
	s.sweeper = s.cfg.Clock.AfterFunc(max(next.Sub(now), 0), s.sweepLater)
}

// sweepLater is the timer's sweep: it frees what expired and sets the
// timer for what is left.
func (s *Store) sweepLater() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweeper = nil
	if s.closed {
		return
	}
	now := s.cfg.Clock.Now()
	s.sweepLocked(now)
	s.armLocked(now)
}

// Handler serves the store at stageapi.EncoderCachePath{key} (GET reads
// an entry) and stageapi.EncoderLeasePath{lease} (DELETE releases a
// lease); mount it at both. The worker's own secret check guards it.
func (s *Store) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && r.PathValue("key") != "":
			e, err := s.Get(r.PathValue("key"))
			if err != nil {
				http.Error(w, err.Error(), http.StatusNotFound)
				return
			}
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = w.Write(Encode(e))
		case r.Method == http.MethodDelete && r.PathValue("lease") != "":
			if !s.Release(r.PathValue("lease")) {
				http.Error(w, ErrNotFound.Error(), http.StatusNotFound)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		default:
			w.Header().Set("Allow", "GET (an entry), DELETE (a lease)")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		}
	})
}

// The wire form: magic "OECC", then for the audio rows and the vision rows
// a little-endian uint32 row count and width and the float32 values.
var magic = [4]byte{'O', 'E', 'C', 'C'}

// maxElements bounds what Decode accepts (1 GiB of float32).
const maxElements = 1 << 28

// Encode writes e in the wire form.
func Encode(e *Entry) []byte {
	var b bytes.Buffer
	b.Write(magic[:])
	for _, rows := range [][][]float32{e.Audio, e.Vision} {
		width := 0
		if len(rows) > 0 {
			width = len(rows[0])
		}
		var head [8]byte
		binary.LittleEndian.PutUint32(head[:4], uint32(len(rows)))
		binary.LittleEndian.PutUint32(head[4:], uint32(width))
		b.Write(head[:])
		var v [4]byte
		for _, r := range rows {
			for _, x := range r {
				binary.LittleEndian.PutUint32(v[:], math.Float32bits(x))
				b.Write(v[:])
			}
		}
	}
	return b.Bytes()
}

// Decode reads the wire form, refusing anything inconsistent.
func Decode(data []byte) (*Entry, error) {
	if len(data) < 4 || [4]byte(data[:4]) != magic {
		return nil, ErrCorrupt
	}
	data = data[4:]
	e := &Entry{}
	for _, dst := range []*[][]float32{&e.Audio, &e.Vision} {
		if len(data) < 8 {
			return nil, fmt.Errorf("%w: truncated header", ErrCorrupt)
		}
		n, w := uint64(binary.LittleEndian.Uint32(data)), uint64(binary.LittleEndian.Uint32(data[4:]))
		data = data[8:]
		if n*w > maxElements || uint64(len(data)) < 4*n*w {
			return nil, fmt.Errorf("%w: %d rows of %d do not fit %d bytes", ErrCorrupt, n, w, len(data))
		}
		rows := make([][]float32, n)
		for i := range rows {
			rows[i] = make([]float32, w)
			for j := range rows[i] {
				rows[i][j] = math.Float32frombits(binary.LittleEndian.Uint32(data))
				data = data[4:]
			}
		}
		*dst = rows
	}
	if len(data) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(data))
	}
	return e, nil
}

// Fetch reads the entry under key from the worker at baseURL, leaving it
// there.
func Fetch(ctx context.Context, client *http.Client, baseURL, key, secret string) (*Entry, error) {
	body, err := call(ctx, client, http.MethodGet, baseURL, stageapi.EncoderCachePath, key, secret)
	if err != nil {
		return nil, err
	}
	return Decode(body)
}

// Release ends lease at the worker at baseURL.
func Release(ctx context.Context, client *http.Client, baseURL, lease, secret string) error {
	_, err := call(ctx, client, http.MethodDelete, baseURL, stageapi.EncoderLeasePath, lease, secret)
	return err
}

func call(ctx context.Context, client *http.Client, method, baseURL, path, key, secret string) ([]byte, error) {
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, method, baseURL+path+url.PathEscape(key), nil)
	if err != nil {
		return nil, fmt.Errorf("eccache: %w", err)
	}
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("eccache: %s %s: %w", method, key, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8*maxElements+64))
	if err != nil {
		return nil, fmt.Errorf("eccache: read %s: %w", key, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, fmt.Errorf("%w: %q at %s", ErrNotFound, key, baseURL)
	case resp.StatusCode == http.StatusUnauthorized:
		return nil, fmt.Errorf("%w at %s", ErrAuth, baseURL)
	case resp.StatusCode >= 300:
		return nil, fmt.Errorf("eccache: %s %s: HTTP %d: %s", method, key, resp.StatusCode, bytes.TrimSpace(body))
	}
	return body, nil
}
