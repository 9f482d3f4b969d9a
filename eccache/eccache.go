// Package eccache owns the reference encoder cache of encoder
// disaggregation (E/P/D): an encoder worker keeps the rows its encoders
// made for a media item under the item's content hash, and a prefill worker
// fetches them by that key, worker to worker, instead of encoding — vLLM's
// EC connectors key encoder outputs by the item's multimodal hash the same
// way. An entry is read as often as asked (a request retried on another
// prefill fetches it again) and lives until it is released (the request
// ended) or its TTL runs out; Len is the gauge that shows none are left.
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
}

type held struct {
	entry   *Entry
	expires time.Time
}

// NewStore makes a store.
func NewStore(cfg Config) *Store {
	if cfg.TTL <= 0 {
		cfg.TTL = 60 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Store{cfg: cfg, entries: map[string]*held{}}
}

// Put keeps e under key, replacing what was there (the same item encoded
// again gives the same rows).
func (s *Store) Put(key string, e *Entry) error {
	if key == "" || len(key) > 256 {
		return fmt.Errorf("eccache: invalid key %q", key)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked()
	s.entries[key] = &held{entry: e, expires: s.cfg.Now().Add(s.cfg.TTL)}
	return nil
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

// Drop frees the entry under key; false when there was none.
func (s *Store) Drop(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.entries[key]
	delete(s.entries, key)
	return ok
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
	for k, h := range s.entries {
		if now.After(h.expires) {
			delete(s.entries, k)
		}
	}
}

// Path is where a worker serves its store: GET reads an entry, DELETE
// frees it.
const Path = "/v1/omnipd/encoder-cache/"

// Handler serves the store at Path{key}; the worker's own secret check
// guards it.
func (s *Store) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("key")
		switch r.Method {
		case http.MethodGet:
			e, err := s.Get(key)
			if err != nil {
				http.Error(w, err.Error(), http.StatusNotFound)
				return
			}
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = w.Write(Encode(e))
		case http.MethodDelete:
			if !s.Drop(key) {
				http.Error(w, ErrNotFound.Error(), http.StatusNotFound)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		default:
			w.Header().Set("Allow", "GET, DELETE")
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
	body, err := call(ctx, client, http.MethodGet, baseURL, key, secret)
	if err != nil {
		return nil, err
	}
	return Decode(body)
}

// Release frees the entry under key at the worker at baseURL.
func Release(ctx context.Context, client *http.Client, baseURL, key, secret string) error {
	_, err := call(ctx, client, http.MethodDelete, baseURL, key, secret)
	return err
}

func call(ctx context.Context, client *http.Client, method, baseURL, key, secret string) ([]byte, error) {
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, method, baseURL+Path+url.PathEscape(key), nil)
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
