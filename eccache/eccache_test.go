package eccache

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"
)

func entry() *Entry {
	return &Entry{
		Audio:  [][]float32{{1, -2.5, 3}, {0.25, 0, -1}},
		Vision: [][]float32{{9, 8, 7}},
	}
}

// An entry travels worker to worker bit for bit, is read as often as asked
// (a retried prefill reads it again), and is gone once released.
func TestFetchReleaseOverHTTP(t *testing.T) {
	s := NewStore(Config{})
	mux := http.NewServeMux()
	mux.Handle(Path+"{key}", s.Handler())
	hs := httptest.NewServer(mux)
	defer hs.Close()
	if err := s.Put("sha256:ab/cd", entry()); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		got, err := Fetch(context.Background(), hs.Client(), hs.URL, "sha256:ab/cd", "")
		if err != nil || !reflect.DeepEqual(got, entry()) {
			t.Fatalf("fetch: %+v, %v", got, err)
		}
	}
	if err := Release(context.Background(), hs.Client(), hs.URL, "sha256:ab/cd", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := Fetch(context.Background(), hs.Client(), hs.URL, "sha256:ab/cd", ""); !errors.Is(err, ErrNotFound) {
		t.Errorf("fetch after release: %v", err)
	}
	if n := s.Len(); n != 0 {
		t.Errorf("%d entries left", n)
	}
}

// Entries nobody releases go at their TTL.
func TestTTL(t *testing.T) {
	now := time.Unix(1000, 0)
	s := NewStore(Config{TTL: time.Minute, Now: func() time.Time { return now }})
	_ = s.Put("k", entry())
	now = now.Add(2 * time.Minute)
	if _, err := s.Get("k"); !errors.Is(err, ErrNotFound) || s.Len() != 0 {
		t.Errorf("an entry outlived its TTL: %v, %d held", err, s.Len())
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
