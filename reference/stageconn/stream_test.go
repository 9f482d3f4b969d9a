package stageconn

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/omnipd/omnipd/stageapi"
)

// grow opens a stash under key with src's head and no rows.
func grow(t *testing.T, s *Store, key string, src *stageapi.Conditioning) {
	t.Helper()
	head := &stageapi.Conditioning{TTSPad: src.TTSPad, TTSBos: src.TTSBos, TTSEos: src.TTSEos, PromptTokenIDs: src.PromptTokenIDs, TokenIDs: append([]int(nil), src.PromptTokenIDs...)}
	if err := s.Open(key, head); err != nil {
		t.Fatal(err)
	}
}

// readAll reads key from offset 0 to the end the way a Talker does, one
// read at a time, and returns the rows joined.
func readAll(ctx context.Context, read func(ctx context.Context, from int) (*stageapi.Conditioning, bool, error)) (*stageapi.Conditioning, int, error) {
	var out *stageapi.Conditioning
	reads := 0
	for {
		from := 0
		if out != nil {
			from = len(out.Embed)
		}
		st, done, err := read(ctx, from)
		if err != nil {
			return nil, reads, err
		}
		reads++
		if out == nil {
			out = st
		} else {
			out.Embed = append(out.Embed, st.Embed...)
			out.Hidden = append(out.Hidden, st.Hidden...)
			out.TokenIDs = st.TokenIDs
		}
		if done {
			return out, reads, nil
		}
	}
}

// Rows appended one step at a time while a reader waits come out whole, in
// order, and the stash is freed after the last read.
func TestGrowingStashReadsWhatWasAppended(t *testing.T) {
	src := sample(9, 4)
	s := NewStore(Config{})
	grow(t, s, "k", src)
	if _, err := s.Take("k"); !errors.Is(err, ErrGrowing) {
		t.Fatalf("Take of an open stash: %v; want ErrGrowing", err)
	}
	got := make(chan *stageapi.Conditioning, 1)
	errc := make(chan error, 1)
	go func() {
		st, _, err := readAll(context.Background(), func(ctx context.Context, from int) (*stageapi.Conditioning, bool, error) {
			return s.Read(ctx, "k", from)
		})
		got <- st
		errc <- err
	}()
	np := len(src.PromptTokenIDs)
	// The first step brings the prompt's rows, each later one one row.
	steps := [][2]int{{0, np}}
	for i := np; i < len(src.Embed); i++ {
		steps = append(steps, [2]int{i, i + 1})
	}
	for _, st := range steps {
		tok := src.TokenIDs[st[1] : st[1]+1]
		if err := s.Append("k", src.Embed[st[0]:st[1]], src.Hidden[st[0]:st[1]], tok); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close("k"); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if st := <-got; !reflect.DeepEqual(st, src) {
		t.Errorf("read back\n%+v\nwant\n%+v", st, src)
	}
	if n := s.Len(); n != 0 {
		t.Errorf("%d stashes left after the last read", n)
	}
}

// A reader waiting for rows returns when its context ends, when the stash
// is dropped and when its writer fails; a writer learns of the drop.
func TestGrowingStashWaitEnds(t *testing.T) {
	src := sample(3, 2)
	s := NewStore(Config{})
	waiting := func(key string, from int) chan error {
		errc := make(chan error, 1)
		go func() {
			_, _, err := s.Read(context.Background(), key, from)
			errc <- err
		}()
		return errc
	}

	ctx, cancel := context.WithCancel(context.Background())
	grow(t, s, "cancel", src)
	errc := make(chan error, 1)
	go func() { _, _, err := s.Read(ctx, "cancel", 0); errc <- err }()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled read: %v", err)
	}

	grow(t, s, "drop", src)
	errc = waiting("drop", 0)
	if !s.Drop("drop") {
		t.Fatal("nothing dropped")
	}
	if err := <-errc; !errors.Is(err, ErrNotFound) {
		t.Errorf("read of a dropped stash: %v", err)
	}
	if err := s.Append("drop", src.Embed[:1], src.Hidden[:1], nil); !errors.Is(err, ErrNotFound) {
		t.Errorf("append to a dropped stash: %v", err)
	}

	grow(t, s, "fail", src)
	errc = waiting("fail", 0)
	_ = s.Fail("fail", errors.New("engine closed"))
	if err := <-errc; !errors.Is(err, ErrFailed) {
		t.Errorf("read of a failed stash: %v", err)
	}
	s.Drop("cancel")
	if n := s.Len(); n != 0 {
		t.Errorf("%d stashes left", n)
	}
}

// An open stash nobody appends to or reads is freed at its TTL, and its
// waiting reader is woken.
func TestGrowingStashTTL(t *testing.T) {
	s := NewStore(Config{TTL: 20 * time.Millisecond})
	grow(t, s, "k", sample(2, 2))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := s.Read(ctx, "k", 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("read past the TTL: %v; want ErrNotFound", err)
	}
}

// Over HTTP a read that waited ReadWait in vain answers with no rows and
// the reader asks again; the rows, the head and the end come across, and a
// put stash reads as a closed one.
func TestGrowingStashOverHTTP(t *testing.T) {
	src := sample(6, 3)
	s := NewStore(Config{ReadWait: 5 * time.Millisecond})
	hs := serveStore(t, s)

	grow(t, s, "a/b", src)
	type result struct {
		st    *stageapi.Conditioning
		reads int
		err   error
	}
	res := make(chan result, 1)
	go func() {
		st, reads, err := readAll(context.Background(), func(ctx context.Context, from int) (*stageapi.Conditioning, bool, error) {
			st, info, err := FetchFrom(ctx, hs.Client(), hs.URL, "a/b", "", from)
			return st, info.Done, err
		})
		res <- result{st, reads, err}
	}()
	np := len(src.PromptTokenIDs)
	_ = s.Append("a/b", src.Embed[:np], src.Hidden[:np], src.TokenIDs[np:np+1])
	time.Sleep(20 * time.Millisecond) // let at least one read come back empty
	for i := np; i < len(src.Embed); i++ {
		_ = s.Append("a/b", src.Embed[i:i+1], src.Hidden[i:i+1], src.TokenIDs[i+1:i+2])
	}
	_ = s.Close("a/b")
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !reflect.DeepEqual(r.st, src) {
		t.Errorf("read back over HTTP\n%+v\nwant\n%+v", r.st, src)
	}
	if err := s.Put("whole", src); err != nil {
		t.Fatal(err)
	}
	st, info, err := FetchFrom(context.Background(), hs.Client(), hs.URL, "whole", "", 2)
	if err != nil || !info.Done || info.Waited || !reflect.DeepEqual(st.Embed, src.Embed[2:]) {
		t.Errorf("put stash from offset 2: %+v, err %v", info, err)
	}
	if _, _, err := FetchFrom(context.Background(), hs.Client(), hs.URL, "whole", "", 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("second read of a finished stash: %v", err)
	}
	if n := s.Len(); n != 0 {
		t.Errorf("%d stashes left", n)
	}
}

// A read may come before the stash it asks for (the Talker of a whole
// answer starts when the decode leg is sent): it waits for the stash to be
// opened, while a read of a key whose stash ended, or that was released,
// answers not found at once rather than waiting for a stash that will
// never come.
func TestReadBeforeStash(t *testing.T) {
	src := sample(2, 2)
	s := NewStore(Config{})
	errc := make(chan error, 1)
	got := make(chan *stageapi.Conditioning, 1)
	go func() {
		st, _, err := readAll(context.Background(), func(ctx context.Context, from int) (*stageapi.Conditioning, bool, error) {
			return s.Read(ctx, "later", from)
		})
		got <- st
		errc <- err
	}()
	grow(t, s, "later", src)
	if err := s.Append("later", src.Embed, src.Hidden, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Close("later"); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("read before the stash: %v", err)
	}
	if st := <-got; !reflect.DeepEqual(st.Embed, src.Embed) {
		t.Errorf("read before the stash got %d rows; want the %d appended", len(st.Embed), len(src.Embed))
	}

	// Never stashed: the read waits until its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, _, err := s.Read(ctx, "never", 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("read of a key never stashed: %v; want ErrNotFound once the wait ends", err)
	}

	// Ended or released: not found at once, with no deadline to end a wait.
	s.Drop("released")
	for _, key := range []string{"later", "released"} {
		done := make(chan error, 1)
		go func() { _, _, err := s.Read(context.Background(), key, 0); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, ErrNotFound) {
				t.Errorf("read of %q: %v; want ErrNotFound", key, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the read of %q, whose stash ended, waits for it", key)
		}
	}
}

// A read that finds nothing at its offset says it waited for the Thinker
// (the Talker was ahead of it), also when the worker's wait ends with no
// rows; one whose rows are there does not.
func TestReadSaysItWaited(t *testing.T) {
	src := sample(3, 2)
	s := NewStore(Config{ReadWait: 20 * time.Millisecond})
	hs := serveStore(t, s)
	grow(t, s, "k", src)
	if err := s.Append("k", src.Embed[:1], src.Hidden[:1], nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		from   int
		rows   int
		waited bool
	}{{0, 1, false}, {1, 0, true}} {
		st, info, err := FetchFrom(context.Background(), hs.Client(), hs.URL, "k", "", c.from)
		if err != nil || len(st.Embed) != c.rows || info.Waited != c.waited || info.Done {
			t.Errorf("read from %d: %d rows, %+v, err %v; want %d rows, waited %v", c.from, len(st.Embed), info, err, c.rows, c.waited)
		}
	}
	// No stash yet (its leg is on its way): an empty answer that waited.
	st, info, err := FetchFrom(context.Background(), hs.Client(), hs.URL, "not-yet", "", 0)
	if err != nil || len(st.Embed) != 0 || !info.Waited {
		t.Errorf("read of a key not stashed yet: %d rows, %+v, err %v; want an empty answer that waited", len(st.Embed), info, err)
	}
	s.Drop("k")
}

// A reader waiting for a key not stashed yet, from a row past the first,
// sees the stash only once it is open: Open makes it open in one step, so
// the reader never finds it closed and empty ("offset 1 is past the 0
// rows") in between.
func TestReadBeforeOpenPastTheFirstRow(t *testing.T) {
	src := sample(3, 2)
	s := NewStore(Config{})
	for i := range 2000 {
		key := fmt.Sprint("k", i)
		errc := make(chan error, 1)
		go func() {
			_, _, err := s.Read(context.Background(), key, 1)
			errc <- err
		}()
		grow(t, s, key, src)
		if err := s.Append(key, src.Embed, src.Hidden, nil); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("read %d from row 1 before the stash was opened: %v", i, err)
		}
		s.Drop(key)
	}
}

// serveStore serves s at Path over loopback until the test ends.
func serveStore(t *testing.T, s *Store) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(stageapi.ConditioningPath+"{key}", s.Handler())
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	return hs
}
