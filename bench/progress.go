package bench

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Progress shows a run as it goes on a writer (stderr): completed of total,
// the completion rate, errors and elapsed time. On a terminal one line is
// redrawn in place; elsewhere (a log file, CI) a plain line is written at
// every tenth of the run and at least every Every. A nil *Progress is quiet.
type Progress struct {
	w   io.Writer
	tty bool
	// Every is the longest gap between plain lines (default 10s).
	Every time.Duration

	mu               sync.Mutex // guards everything below and writes to w
	label            string
	total            int
	duration         time.Duration
	start, lastLine  time.Time
	finished, failed int
	tenth            int
	stop             chan struct{}
	stopped          chan struct{}
}

// NewProgress reports to w; tty says whether w is a terminal.
func NewProgress(w io.Writer, tty bool) *Progress {
	return &Progress{w: w, tty: tty, Every: 10 * time.Second}
}

func (p *Progress) begin(label string, total int, duration time.Duration) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.label, p.total, p.duration = label, total, duration
	p.start, p.lastLine = time.Now(), time.Now()
	p.finished, p.failed, p.tenth = 0, 0, 0
	p.stop, p.stopped = make(chan struct{}), make(chan struct{})
	every := p.Every
	if p.tty {
		every = 250 * time.Millisecond
	} else if every <= 0 {
		every = 10 * time.Second
	}
	p.mu.Unlock()
	go p.tick(every)
}

// tick redraws the terminal line, or writes a plain line when none was
// written for a while.
func (p *Progress) tick(every time.Duration) {
	defer close(p.stopped)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.mu.Lock()
			if p.tty || time.Since(p.lastLine) >= every {
				p.writeLocked(false)
			}
			p.mu.Unlock()
		}
	}
}

func (p *Progress) done(ok, canceled bool) {
	if p == nil || canceled {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.finished++
	if !ok {
		p.failed++
	}
	if !p.tty && p.total > 0 {
		// A line per tenth of the run, but not more than one a second.
		if tenth := 10 * p.finished / p.total; tenth > p.tenth && p.finished < p.total && time.Since(p.lastLine) >= time.Second {
			p.tenth = tenth
			p.writeLocked(false)
		}
	}
}

func (p *Progress) end() {
	if p == nil {
		return
	}
	close(p.stop)
	<-p.stopped
	p.mu.Lock()
	p.writeLocked(true)
	p.mu.Unlock()
}

func (p *Progress) writeLocked(final bool) {
	p.lastLine = time.Now()
	line := p.line(time.Since(p.start))
	switch {
	case p.tty && final:
		fmt.Fprintf(p.w, "\r%s\x1b[K\n", line)
	case p.tty:
		fmt.Fprintf(p.w, "\r%s\x1b[K", line)
	default:
		fmt.Fprintln(p.w, line)
	}
}

// line is the progress text after elapsed.
func (p *Progress) line(elapsed time.Duration) string {
	var b strings.Builder
	b.WriteString(p.label)
	b.WriteString("  ")
	if p.total > 0 {
		const width = 24
		filled := min(width, width*p.finished/p.total)
		fmt.Fprintf(&b, "[%s%s] %d/%d", strings.Repeat("#", filled), strings.Repeat(".", width-filled), p.finished, p.total)
	} else {
		fmt.Fprintf(&b, "%d done", p.finished)
	}
	rps := 0.0
	if s := elapsed.Seconds(); s > 0 {
		rps = float64(p.finished) / s
	}
	fmt.Fprintf(&b, "  %.2f req/s  %d errors  %.1fs", rps, p.failed, elapsed.Seconds())
	if p.duration > 0 {
		fmt.Fprintf(&b, "/%.0fs", p.duration.Seconds())
	}
	return b.String()
}
