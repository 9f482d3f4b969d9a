package stageconn

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/omnipd/omnipd/stageapi"
)

func sample(rows, width int) *stageapi.Conditioning {
	rng := rand.New(rand.NewPCG(1, 2))
	mk := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = rng.Float32()*2 - 1
		}
		return v
	}
	st := &stageapi.Conditioning{TTSPad: mk(width), TTSBos: mk(width), TTSEos: mk(width)}
	for range rows {
		st.Embed = append(st.Embed, mk(width))
		st.Hidden = append(st.Hidden, mk(width))
	}
	for i := range rows + 1 {
		st.TokenIDs = append(st.TokenIDs, i*7)
	}
	st.PromptTokenIDs = st.TokenIDs[:rows/2+1]
	return st
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// A stash is freed when fetched, when dropped, or when its TTL ends.
func TestStoreLifecycle(t *testing.T) {
	c := &clock{t: time.Unix(0, 0)}
	s := NewStore(Config{TTL: time.Minute, Now: c.now})
	for _, k := range []string{"a", "b", "c"} {
		if err := s.Put(k, sample(2, 2)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Put("a", sample(1, 1)); !errors.Is(err, ErrExists) {
		t.Errorf("second Put under a key: %v", err)
	}
	if s.Len() != 3 {
		t.Fatalf("len %d", s.Len())
	}
	if _, err := s.Take("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Take("a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a stash can be taken once: %v", err)
	}
	if !s.Drop("b") || s.Drop("b") {
		t.Error("drop")
	}
	c.add(2 * time.Minute)
	if n := s.Sweep(); n != 1 || s.Len() != 0 {
		t.Errorf("expiry freed %d, %d left", n, s.Len())
	}
	// A release that overtakes its stash: the late stash is discarded.
	if s.Drop("late") {
		t.Error("dropped a key that was never stashed")
	}
	if err := s.Put("late", sample(1, 1)); !errors.Is(err, ErrReleased) || s.Len() != 0 {
		t.Errorf("a stash put after its release: %v, %d held", err, s.Len())
	}
	if err := s.Put("late", sample(1, 1)); err != nil {
		t.Errorf("the tombstone is used once: %v", err)
	}
}

func TestFetchOverHTTP(t *testing.T) {
	s := NewStore(Config{Secret: "s3"})
	mux := http.NewServeMux()
	mux.Handle(stageapi.ConditioningPath+"{key}", s.Handler())
	hs := httptest.NewServer(mux)
	defer hs.Close()
	st := sample(5, 6)
	if err := s.Put("req-1/decode", st); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := Fetch(ctx, nil, hs.URL, "req-1/decode", "wrong"); !errors.Is(err, ErrAuth) {
		t.Errorf("fetch with the wrong secret: %v", err)
	}
	if _, err := Fetch(ctx, nil, hs.URL, "req-1/decode", ""); !errors.Is(err, ErrAuth) {
		t.Errorf("fetch without the secret: %v", err)
	}
	if s.Len() != 1 {
		t.Fatal("a refused fetch freed the stash")
	}
	got, err := Fetch(ctx, nil, hs.URL, "req-1/decode", "s3")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, st) {
		t.Error("fetched stash differs")
	}
	if s.Len() != 0 {
		t.Error("a fetched stash stays")
	}
	if _, err := Fetch(ctx, nil, hs.URL, "req-1/decode", "s3"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second fetch: %v", err)
	}
	_ = s.Put("k2", sample(1, 1))
	if err := Release(ctx, nil, hs.URL, "k2", "s3"); err != nil || s.Len() != 0 {
		t.Errorf("release: %v, %d left", err, s.Len())
	}
}
