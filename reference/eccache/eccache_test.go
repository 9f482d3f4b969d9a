package eccache

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/omnipd/omnipd/stageapi"
)

func entry() *Entry {
	return &Entry{
		Audio:  [][]float32{{1, -2.5, 3}, {0.25, 0, -1}},
		Vision: [][]float32{{9, 8, 7}},
	}
}

// An entry travels worker to worker bit for bit and is read as often as
// asked (a retried prefill reads it again); two requests with the same item
// share it, and it goes when the last of their leases is released.
func TestFetchReleaseOverHTTP(t *testing.T) {
	s := NewStore(Config{})
	mux := http.NewServeMux()
	mux.Handle(stageapi.EncoderCachePath+"{key}", s.Handler())
	mux.Handle(stageapi.EncoderLeasePath+"{lease}", s.Handler())
	hs := httptest.NewServer(mux)
	defer hs.Close()
	for _, lease := range []string{"req-1", "req-2"} {
		if err := s.Put("sha256:ab/cd", lease, entry()); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		got, err := Fetch(context.Background(), hs.Client(), hs.URL, "sha256:ab/cd", "")
		if err != nil || !reflect.DeepEqual(got, entry()) {
			t.Fatalf("fetch: %+v, %v", got, err)
		}
	}
	if err := Release(context.Background(), hs.Client(), hs.URL, "req-1", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := Fetch(context.Background(), hs.Client(), hs.URL, "sha256:ab/cd", ""); err != nil {
		t.Errorf("an entry another request still holds is gone: %v", err)
	}
	if err := Release(context.Background(), hs.Client(), hs.URL, "req-2", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := Fetch(context.Background(), hs.Client(), hs.URL, "sha256:ab/cd", ""); !errors.Is(err, ErrNotFound) {
		t.Errorf("fetch after the last release: %v", err)
	}
	if err := Release(context.Background(), hs.Client(), hs.URL, "req-2", ""); !errors.Is(err, ErrNotFound) {
		t.Errorf("a lease released twice: %v", err)
	}
	if n := s.Len(); n != 0 || len(s.leases) != 0 {
		t.Errorf("%d entries and %d leases left", n, len(s.leases))
	}
}

// Entries nobody releases go at their TTL.
func TestTTL(t *testing.T) {
	clock := newFakeClock()
	s := NewStore(Config{TTL: time.Minute, Clock: clock})
	_ = s.Put("k", "req", entry())
	clock.mu.Lock()
	clock.now = clock.now.Add(2 * time.Minute) // and no timer runs: the calls themselves sweep
	clock.mu.Unlock()
	if _, err := s.Get("k"); !errors.Is(err, ErrNotFound) || s.Len() != 0 || len(s.leases) != 0 {
		t.Errorf("an entry outlived its TTL: %v, %d held, %d leases", err, s.Len(), len(s.leases))
	}
}

// The decoder refuses what is not an entry or does not add up.
func TestDecodeRefuses(t *testing.T) {
	good := Encode(entry())
	for name, b := range map[string][]byte{
		"empty":     nil,
		"magic":     append([]byte("XXXX"), good[4:]...),
		"truncated": good[:len(good)-3],
		"trailing":  append(append([]byte{}, good...), 0),
		"huge":      {'O', 'E', 'C', 'C', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
	} {
		if _, err := Decode(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// A release can overtake the encoder leg it ends: what that leg would keep
// afterwards is discarded, so nothing waits for its TTL.
func TestReleaseBeforePut(t *testing.T) {
	s := NewStore(Config{})
	if s.Release("late") {
		t.Error("a lease holding nothing released something")
	}
	if err := s.Put("k", "late", entry()); !errors.Is(err, ErrReleased) || s.Len() != 0 {
		t.Errorf("put under a released lease: %v, %d held", err, s.Len())
	}
}
