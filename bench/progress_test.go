package bench

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestProgress(t *testing.T) {
	for _, tty := range []bool{true, false} {
		var out lockedBuf
		p := NewProgress(&out, tty)
		p.begin("rate 4", 3, 0)
		p.done(true, false)
		p.done(false, false)
		p.done(true, true) // canceled: not counted
		p.done(true, false)
		p.end()
		got := out.String()
		last := got[strings.LastIndexAny(strings.TrimSuffix(got, "\n"), "\r\n")+1:]
		if !strings.HasPrefix(last, "rate 4  [########################] 3/3") || !strings.Contains(last, "1 errors") || !strings.HasSuffix(got, "\n") {
			t.Errorf("tty %v: final line %q", tty, last)
		}
		if strings.Contains(got, "\r") != tty || strings.Contains(got, "\x1b[K") != tty {
			t.Errorf("tty %v: in-place redraw %q", tty, got)
		}
	}
	var out lockedBuf
	p := NewProgress(&out, false)
	p.begin("concurrency 2", 0, time.Minute)
	p.done(true, false)
	p.end()
	if got := out.String(); !strings.HasPrefix(got, "concurrency 2  1 done") || !strings.Contains(got, "/60s") {
		t.Errorf("duration-bounded line %q", got)
	}
	var quiet *Progress
	quiet.begin("x", 1, 0)
	quiet.done(true, false)
	quiet.end()
}
