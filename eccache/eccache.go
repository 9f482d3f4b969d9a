// Package eccache owns the reference encoder cache of encoder
// disaggregation (E/P/D): an encoder worker keeps the rows its encoders
// made for a media item under the item's content hash, and a prefill worker
// fetches them by that key, worker to worker, instead of encoding — vLLM's
// EC connectors key encoder outputs by the item's multimodal hash the same
// way. An entry is read as often as asked (a request retried on another
// prefill fetches it again) and is held under leases, one per request that
// asked for it (the same item in two requests is one entry); it lives until
// its last lease is released (the requests ended) or its TTL runs out. A
// lease is released by name, so a request whose encoder answer never came
// still frees what the encoder kept for it. Len is the gauge that shows
// none are left.
package eccache

import (
	"bytes"
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
)

// Config configures a Store; the zero value works.
type Config struct {
	// TTL bounds how long an entry waits to be released (default 60 s).
	TTL time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Store holds entries by key. Safe for concurrent use.
type Store struct {
	cfg     Config
	mu      sync.Mutex
	entries map[string]*held
	leases  map[string]map[string]bool // lease → keys it holds
	// released remembers leases released before anything was kept under
	// them, until the TTL: a release can overtake the encoder leg it ends
	// (the leg stalled on its way), whose outputs are then not kept.
	released map[string]time.Time
}

type held struct {
	entry   *Entry
	expires time.Time
	leases  map[string]bool
}

// NewStore makes a store.
func NewStore(cfg Config) *Store {
	if cfg.TTL <= 0 {
		cfg.TTL = 60 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Store{cfg: cfg, entries: map[string]*held{}, leases: map[string]map[string]bool{}, released: map[string]time.Time{}}
}

// Put keeps e under key for lease, replacing the rows that were there (the
// same item encoded again gives the same rows) and adding lease to the
// entry's holders.
func (s *Store) Put(key, lease string, e *Entry) error {
	if key == "" || len(key) > 256 || lease == "" || len(lease) > 256 {
		return fmt.Errorf("eccache: invalid key %q or lease %q", key, lease)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked()
	if _, gone := s.released[lease]; gone {
		return fmt.Errorf("%w: %q", ErrReleased, lease)
	}
	h, ok := s.entries[key]
	if !ok {
		h = &held{leases: map[string]bool{}}
		s.entries[key] = h
	}
	h.entry, h.expires = e, s.cfg.Now().Add(s.cfg.TTL)
	h.leases[lease] = true
	if s.leases[lease] == nil {
		s.leases[lease] = map[string]bool{}
	}
	s.leases[lease][key] = true
	return nil
}

// Release ends lease: the entries it alone held are freed. False when the
// lease holds nothing.
func (s *Store) Release(lease string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys, ok := s.leases[lease]
	delete(s.leases, lease)
	s.released[lease] = s.cfg.Now().Add(s.cfg.TTL)
	for key := range keys {
		if h, ok := s.entries[key]; ok {
			delete(h.leases, lease)
			if len(h.leases) == 0 {
				delete(s.entries, key)
			}
		}
	}
	return ok
}

// Get returns the entry under key, leaving it in place.
func (s *Store) Get(key string) (*Entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked()
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
	s.sweepLocked()
	return len(s.entries)
}

func (s *Store) sweepLocked() {
	now := s.cfg.Now()
	for lease, until := range s.released {
		if now.After(until) {
			delete(s.released, lease)
		}
	}
	for k, h := range s.entries {
		if now.After(h.expires) {
			delete(s.entries, k)
			for lease := range h.leases {
				delete(s.leases[lease], k)
				if len(s.leases[lease]) == 0 {
					delete(s.leases, lease)
				}
			}
		}
	}
}

// Paths where a worker serves its store: GET Path{key} reads an entry,
// DELETE LeasePath{lease} releases a lease.
const (
	Path      = "/v1/omnipd/encoder-cache/"
	LeasePath = "/v1/omnipd/encoder-leases/"
)

// Handler serves the store at Path{key} and LeasePath{lease}; mount it
// at both. The worker's own secret check guards it.
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
	body, err := call(ctx, client, http.MethodGet, baseURL, Path, key, secret)
	if err != nil {
		return nil, err
	}
	return Decode(body)
}

// Release ends lease at the worker at baseURL.
func Release(ctx context.Context, client *http.Client, baseURL, lease, secret string) error {
	_, err := call(ctx, client, http.MethodDelete, baseURL, LeasePath, lease, secret)
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
