// Package stageconn owns the downstream data path of an omni pipeline: a
// Thinker worker keeps the conditioning rows it computed for a request (the
// layer-0 embeddings, one hidden layer, and the three TTS embeddings) in a
// per-worker Store under a key, and the Talker fetches them from that worker
// by key. Bulk tensors travel worker to worker in the stage API's binary
// OCND body (stageapi.EncodeConditioning), never as JSON through the
// orchestrator.
//
// A stash lives until it is fetched, dropped (the request ended or failed),
// or its TTL runs out; Len is the gauge that shows none are left behind.
package stageconn

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/omnipd/omnipd/stageapi"
)

// Errors of the store.
var (
	ErrNotFound = errors.New("stageconn: no such stash (never stashed, already fetched, dropped or expired)")
	ErrExists   = errors.New("stageconn: key already stashed")
	ErrAuth     = errors.New("stageconn: unauthorized")
	// ErrReleased: the key was released before it was stashed (the request
	// ended while its Thinker leg was finishing); the stash is discarded.
	ErrReleased = errors.New("stageconn: key already released")
	// ErrGrowing: a whole fetch of a stash that grows (or failed); read it
	// from an offset instead.
	ErrGrowing = errors.New("stageconn: the stash is still growing; read it from an offset")
	// ErrFailed: the Thinker failed before it finished the rows.
	ErrFailed = errors.New("stageconn: the stash's writer failed")
)

// Config configures a Store. The zero value works.
type Config struct {
	// TTL bounds how long a stash waits to be fetched (default 60 s).
	TTL time.Duration
	// Secret, when set, is required as "Authorization: Bearer <secret>" on
	// every fetch or drop over HTTP: only the deployment may read tensors.
	Secret string
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// ReadWait bounds how long one read over HTTP waits for rows before it
	// answers with none (default 10 s); the reader then asks again.
	ReadWait time.Duration
}

// Store holds stashes by key. Safe for concurrent use.
type Store struct {
	cfg     Config
	mu      sync.Mutex
	entries map[string]*entry
	// released remembers keys dropped before they were stashed, until the
	// TTL: a release can overtake the stash it is meant to free.
	released map[string]time.Time
	// ended remembers keys whose stash was taken, read to its end, dropped
	// or expired, until the TTL, so that a read of one answers not found at
	// once instead of waiting for a stash that will never come (see Read).
	ended map[string]time.Time
	// stashed is closed, and replaced, whenever a stash is put, waking the
	// reads waiting for a key not stashed yet.
	stashed chan struct{}
	// sweeper enforces the TTL when no call comes to do it: pending while
	// anything waits to expire, nil otherwise.
	sweeper *time.Timer
}

type entry struct {
	stash   *stageapi.Conditioning
	expires time.Time
	// A stash that grows (Open) is open until its writer closes or fails
	// it; grown is closed, and replaced, whenever it changes, waking the
	// readers waiting for more (see Read).
	open  bool
	err   error
	grown chan struct{}
}

// wake tells the readers waiting on e that it changed.
func (e *entry) wake() {
	if e.grown != nil {
		close(e.grown)
		e.grown = make(chan struct{})
	}
}

// NewStore makes a store.
func NewStore(cfg Config) *Store {
	if cfg.TTL <= 0 {
		cfg.TTL = 60 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ReadWait <= 0 {
		cfg.ReadWait = 10 * time.Second
	}
	return &Store{cfg: cfg, entries: map[string]*entry{}, released: map[string]time.Time{}, ended: map[string]time.Time{}, stashed: make(chan struct{})}
}

// Put stashes st under key.
func (s *Store) Put(key string, st *stageapi.Conditioning) error {
	return s.put(key, st, false)
}

// put stashes st under key, growing (open) or not, in one step: a reader
// waiting for the key sees it only as it is meant to be.
func (s *Store) put(key string, st *stageapi.Conditioning, open bool) error {
	if key == "" || len(key) > 256 {
		return fmt.Errorf("stageconn: invalid key %q", key)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked()
	if _, ok := s.entries[key]; ok {
		return fmt.Errorf("%w: %q", ErrExists, key)
	}
	if _, ok := s.released[key]; ok {
		delete(s.released, key)
		s.ended[key] = s.cfg.Now().Add(s.cfg.TTL)
		s.wakeStashedLocked()
		return fmt.Errorf("%w: %q", ErrReleased, key)
	}
	delete(s.ended, key)
	e := &entry{stash: st, expires: s.cfg.Now().Add(s.cfg.TTL)}
	if open {
		e.open, e.grown = true, make(chan struct{})
	}
	s.entries[key] = e
	s.armLocked(s.cfg.TTL)
	s.wakeStashedLocked()
	return nil
}

// wakeStashedLocked wakes the reads waiting for a key not stashed yet.
func (s *Store) wakeStashedLocked() {
	close(s.stashed)
	s.stashed = make(chan struct{})
}

// removeLocked frees the stash under key and remembers that it ended.
func (s *Store) removeLocked(key string) {
	if e, ok := s.entries[key]; ok {
		delete(s.entries, key)
		e.wake()
		s.ended[key] = s.cfg.Now().Add(s.cfg.TTL)
		s.armLocked(s.cfg.TTL)
	}
}

// Take removes and returns the stash under key.
func (s *Store) Take(key string) (*stageapi.Conditioning, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked()
	e, ok := s.entries[key]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, key)
	}
	if e.open || e.err != nil {
		return nil, fmt.Errorf("%w: %q", ErrGrowing, key)
	}
	s.removeLocked(key)
	return e.stash, nil
}

// Drop frees the stash under key; false when there was none, in which case
// a stash put under key before the TTL runs out is discarded.
func (s *Store) Drop(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.entries[key]
	if ok {
		s.removeLocked(key)
	} else {
		s.released[key] = s.cfg.Now().Add(s.cfg.TTL)
		s.armLocked(s.cfg.TTL)
	}
	return ok
}

// armLocked schedules a sweep in d unless one is pending. Without it a
// stash nobody fetched or dropped would outlive its TTL for as long as no
// other call came to the store.
func (s *Store) armLocked(d time.Duration) {
	if s.sweeper == nil {
		s.sweeper = time.AfterFunc(d, s.sweepLater)
	}
}

// sweepLater is the scheduled sweep: it frees what expired and schedules
// the next for the earliest expiry left, if any.
func (s *Store) sweepLater() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweeper = nil
	s.sweepLocked()
	now := s.cfg.Now()
	next := time.Duration(-1)
	soonest := func(t time.Time) {
		if d := t.Sub(now); next < 0 || d < next {
			next = d
		}
	}
	for _, e := range s.entries {
		soonest(e.expires)
	}
	for _, until := range s.released {
		soonest(until)
	}
	for _, until := range s.ended {
		soonest(until)
	}
	if len(s.entries)+len(s.released)+len(s.ended) > 0 {
		s.armLocked(max(next, 10*time.Millisecond))
	}
}

// Sweep frees expired stashes and returns how many.
func (s *Store) Sweep() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sweepLocked()
}

func (s *Store) sweepLocked() int {
	now := s.cfg.Now()
	n := 0
	for k, e := range s.entries {
		if now.After(e.expires) {
			s.removeLocked(k)
			n++
		}
	}
	for k, until := range s.released {
		if now.After(until) {
			delete(s.released, k)
		}
	}
	for k, until := range s.ended {
		if now.After(until) {
			delete(s.ended, k)
		}
	}
	return n
}

// Len is the number of stashes held; expired ones are freed first, so it
// never counts a stash past its TTL.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked()
	return len(s.entries)
}

// Handler serves the store at stageapi.ConditioningPath{key}: GET fetches
// (and frees) a stash, GET with ?from=N reads its rows from offset N (see
// Read), DELETE drops it.
func (s *Store) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.authorized(r) {
			http.Error(w, ErrAuth.Error(), http.StatusUnauthorized)
			return
		}
		key := r.PathValue("key")
		switch r.Method {
		case http.MethodGet:
			if r.URL.Query().Has(stageapi.ConditioningFromParam) {
				s.serveRead(w, r, key)
				return
			}
			st, err := s.Take(key)
			if err != nil {
				http.Error(w, err.Error(), http.StatusNotFound)
				return
			}
			writeStash(w, st)
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

// writeStash answers with st in the wire form.
func writeStash(w http.ResponseWriter, st *stageapi.Conditioning) {
	body, err := stageapi.EncodeConditioning(st)
	if err != nil {
		// Named as this data path's, as every error the handler answers is.
		http.Error(w, "stageconn: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = w.Write(body)
}

func (s *Store) authorized(r *http.Request) bool {
	if s.cfg.Secret == "" {
		return true
	}
	want := "Bearer " + s.cfg.Secret
	got := r.Header.Get("Authorization")
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}
