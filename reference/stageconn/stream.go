package stageconn

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	"github.com/omnipd/omnipd/stageapi"
)

// A stash that grows serves async chunking: the Thinker worker opens it
// when the request starts, appends each step's rows as the engine computes
// them and closes it when the request ends, while the Talker reads it from
// an offset, waiting when it has read everything so far. A put stash is one
// that was closed from the start: Read serves both.

// Open starts a stash under key that grows. head carries what is known
// before the first step (the TTS embeddings, the prompt ids) and may hold
// rows already.
func (s *Store) Open(key string, head *stageapi.Conditioning) error {
	return s.put(key, head, true)
}

// Append adds rows (one embed and one hidden per position) and the tokens
// they bring to an open stash. The store keeps the slices: the caller must
// not change them afterwards. ErrNotFound means the stash was released or
// expired: nobody will read more, so the writer stops.
func (s *Store) Append(key string, embed, hidden [][]float32, tokens []int) error {
	if len(embed) != len(hidden) {
		return fmt.Errorf("stageconn: %d embed rows but %d hidden rows", len(embed), len(hidden))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.openLocked(key)
	if err != nil {
		return err
	}
	e.stash.Embed = append(e.stash.Embed, embed...)
	e.stash.Hidden = append(e.stash.Hidden, hidden...)
	e.stash.TokenIDs = append(e.stash.TokenIDs, tokens...)
	e.expires = s.cfg.Now().Add(s.cfg.TTL)
	e.wake()
	return nil
}

// Close marks an open stash complete: readers get its last rows with done.
func (s *Store) Close(key string) error {
	return s.end(key, nil)
}

// Fail marks an open stash failed: its readers get ErrFailed with cause.
func (s *Store) Fail(key string, cause error) error {
	if cause == nil {
		cause = errors.New("unknown cause")
	}
	return s.end(key, cause)
}

func (s *Store) end(key string, cause error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.openLocked(key)
	if err != nil {
		return err
	}
	e.open, e.err = false, cause
	e.expires = s.cfg.Now().Add(s.cfg.TTL)
	e.wake()
	return nil
}

func (s *Store) openLocked(key string) (*entry, error) {
	s.sweepLocked()
	e, ok := s.entries[key]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, key)
	}
	if !e.open {
		return nil, fmt.Errorf("stageconn: stash %q is not open", key)
	}
	return e, nil
}

// Read returns the rows of key from row offset from on, with the stash's
// TTS embeddings and ids, waiting while there are none yet and the stash is
// open, until ctx ends. done says the rows returned are the last: the
// stash is freed then, as a whole fetch frees it. A key not stashed yet is
// waited for as well, until ctx ends (then ErrNotFound); one whose stash
// ended (read to its end, taken, dropped, expired) or that was released
// answers ErrNotFound at once.
func (s *Store) Read(ctx context.Context, key string, from int) (*stageapi.Conditioning, bool, error) {
	st, done, _, err := s.read(ctx, key, from)
	return st, done, err
}

// read is Read that also tells whether it had to wait for the stash or for
// its rows.
func (s *Store) read(ctx context.Context, key string, from int) (st *stageapi.Conditioning, done, waited bool, err error) {
	if from < 0 {
		return nil, false, false, fmt.Errorf("stageconn: negative offset %d", from)
	}
	for {
		s.mu.Lock()
		s.sweepLocked()
		e, ok := s.entries[key]
		if !ok {
			_, released := s.released[key]
			_, ended := s.ended[key]
			if released || ended {
				s.mu.Unlock()
				return nil, false, waited, fmt.Errorf("%w: %q", ErrNotFound, key)
			}
			// Not stashed yet: the Talker of a whole answer asks as soon
			// as the decode leg is sent, which may be before the worker
			// opened the stash.
			stashed := s.stashed
			s.mu.Unlock()
			waited = true
			select {
			case <-stashed:
				continue
			case <-ctx.Done():
				return nil, false, waited, fmt.Errorf("%w: %w: %q", ErrNotFound, errNotStashed, key)
			}
		}
		if e.err != nil {
			s.removeLocked(key)
			s.mu.Unlock()
			return nil, false, waited, fmt.Errorf("%w: %q: %v", ErrFailed, key, e.err)
		}
		n := len(e.stash.Embed)
		if from > n && !e.open {
			s.mu.Unlock()
			return nil, false, waited, fmt.Errorf("stageconn: offset %d is past the %d rows of %q", from, n, key)
		}
		if from < n || !e.open {
			rows := *e.stash
			rows.Embed = slices.Clone(rows.Embed[min(from, n):])
			rows.Hidden = slices.Clone(rows.Hidden[min(from, n):])
			rows.TokenIDs = slices.Clone(rows.TokenIDs)
			done := !e.open
			if done {
				s.removeLocked(key)
			} else {
				e.expires = s.cfg.Now().Add(s.cfg.TTL)
			}
			s.mu.Unlock()
			return &rows, done, waited, nil
		}
		grown := e.grown
		s.mu.Unlock()
		waited = true
		select {
		case <-grown:
		case <-ctx.Done():
			return nil, false, waited, ctx.Err()
		}
	}
}

// errNotStashed marks a read that waited in vain for its key to be
// stashed; over HTTP it is an empty answer, as a wait for rows is.
var errNotStashed = errors.New("not stashed while the read waited")

// ReadInfo is how a read over HTTP went (see FetchFrom).
type ReadInfo struct {
	// Done: the rows returned are the stash's last; the worker freed it.
	Done bool
	// Waited: the reader was ahead of the Thinker — nothing was there at
	// the offset when the read came (vllm-omni's WAITING_FOR_CHUNK).
	Waited bool
}

func (s *Store) serveRead(w http.ResponseWriter, r *http.Request, key string) {
	from, err := strconv.Atoi(r.URL.Query().Get(stageapi.ConditioningFromParam))
	if err != nil || from < 0 {
		http.Error(w, "stageconn: from must be a row offset", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ReadWait)
	defer cancel()
	st, done, waited, err := s.read(ctx, key, from)
	switch {
	case (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errNotStashed)) && r.Context().Err() == nil:
		// Nothing new yet — no row at the offset, or no stash yet (its leg
		// is on its way to this worker): an empty answer, and the reader
		// asks again.
		st, done, err = &stageapi.Conditioning{}, false, nil
	case errors.Is(err, ErrNotFound):
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	case errors.Is(err, ErrFailed):
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set(stageapi.ConditioningDoneHeader, strconv.FormatBool(done))
	w.Header().Set(stageapi.ConditioningWaitedHeader, strconv.FormatBool(waited))
	writeStash(w, st)
}

// FetchFrom reads a stash's rows from offset from at the worker at
// baseURL (see Store.Read): none when nothing came in the worker's wait,
// done with the last. The worker frees the stash once done was sent.
func FetchFrom(ctx context.Context, client *http.Client, baseURL, key, secret string, from int) (*stageapi.Conditioning, ReadInfo, error) {
	body, hdr, err := callHeader(ctx, client, http.MethodGet, baseURL, url.PathEscape(key)+"?"+stageapi.ConditioningFromParam+"="+strconv.Itoa(from), secret)
	if err != nil {
		return nil, ReadInfo{}, err
	}
	st, err := decode(body)
	if err != nil {
		return nil, ReadInfo{}, err
	}
	return st, ReadInfo{Done: hdr.Get(stageapi.ConditioningDoneHeader) == "true", Waited: hdr.Get(stageapi.ConditioningWaitedHeader) == "true"}, nil
}
