package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/reference/engine/talker"
	"github.com/omnipd/omnipd/reference/stageconn"
	"github.com/omnipd/omnipd/stageapi"
)

// stashFeed reads a request's conditioning from stashes that grow on the
// Thinker workers (async chunk): the colocated Thinker's, or the prefill's
// prompt rows and then the decode's rows after its first, which recomputes
// the prompt's last position — stageapi.MergeConditioning, row by row.
type stashFeed struct {
	s       *TalkerServer
	m       *metrics.StageRequest
	ctx     context.Context
	handles []stageapi.ConditioningHandle
	// skip maps a row of the merged conditioning to the decode stash's:
	// decode row = merged row - skip.
	skip int
	// done[i]: handle i was read to its end, which frees it there.
	done []bool
}

var _ talker.Feed = (*stashFeed)(nil)

// read is one read of handle i from offset from: the worker answers once
// it has rows or the end, or empty after its wait, when it is asked again.
func (f *stashFeed) read(i, from int) (*stageapi.Conditioning, bool, error) {
	h := f.handles[i]
	for {
		start := time.Now()
		st, info, err := stageconn.FetchFrom(f.ctx, f.s.client, h.URL, h.Key, f.s.secret, from)
		if err != nil {
			return nil, false, fmt.Errorf("conditioning %q from %s: %w", h.Key, h.URL, err)
		}
		f.m.ConditioningRead(len(st.Embed), info.Waited, time.Since(start))
		if info.Done {
			f.done[i] = true
		}
		if info.Done || len(st.Embed) > 0 {
			return st, info.Done, nil
		}
	}
}

// head gathers what the Talker needs before it asks for rows: under PD
// the prefill's prompt rows (read to the end: that leg finished) and, from
// the decode, the TTS embeddings with the rows after its duplicate.
func (f *stashFeed) head() (*talker.Conditioning, error) {
	f.done = make([]bool, len(f.handles))
	var pre *stageapi.Conditioning
	if len(f.handles) == 2 {
		for pre == nil || !f.done[0] {
			from := 0
			if pre != nil {
				from = len(pre.Embed)
			}
			st, _, err := f.read(0, from)
			if err != nil {
				return nil, err
			}
			if pre == nil {
				pre = st
			} else {
				pre.Embed, pre.Hidden = append(pre.Embed, st.Embed...), append(pre.Hidden, st.Hidden...)
			}
		}
		p := len(pre.PromptTokenIDs)
		if p == 0 || len(pre.Embed) < p {
			return nil, fmt.Errorf("stageconn: the prefill stash has %d rows for a %d-token prompt", len(pre.Embed), p)
		}
		pre.Embed, pre.Hidden = pre.Embed[:p], pre.Hidden[:p]
		f.skip = p - 1
	}
	last := len(f.handles) - 1
	st, _, err := f.read(last, len(f.handles)-1) // under PD, past the duplicate
	if err != nil {
		return nil, err
	}
	c := &talker.Conditioning{Embed: st.Embed, Hidden: st.Hidden, PromptTokenIDs: st.PromptTokenIDs, TokenIDs: st.TokenIDs,
		TTSPad: st.TTSPad, TTSBos: st.TTSBos, TTSEos: st.TTSEos}
	if pre != nil {
		c.Embed = append(slices.Clone(pre.Embed), st.Embed...)
		c.Hidden = append(slices.Clone(pre.Hidden), st.Hidden...)
		c.PromptTokenIDs = pre.PromptTokenIDs
		if len(c.TTSPad) == 0 {
			c.TTSPad, c.TTSBos, c.TTSEos = pre.TTSPad, pre.TTSBos, pre.TTSEos
		}
	}
	return c, nil
}

// Next reads the decode's (or the colocated Thinker's) rows after the have
// the Talker holds, waiting while the Thinker has computed no more.
func (f *stashFeed) Next(have int) ([][]float32, [][]float32, bool, error) {
	i := len(f.handles) - 1
	if f.done[i] {
		return nil, nil, true, nil
	}
	st, done, err := f.read(i, have-f.skip)
	if err != nil {
		return nil, nil, false, err
	}
	return st.Embed, st.Hidden, done, nil
}

// release frees on the Thinker workers what the Talker did not read to
// the end (it stopped early, failed or was cancelled).
func (f *stashFeed) release() {
	for i, h := range f.handles {
		if i < len(f.done) && f.done[i] {
			continue
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := stageconn.Release(ctx, f.s.client, h.URL, h.Key, f.s.secret); err != nil && !errors.Is(err, stageconn.ErrNotFound) {
				f.s.log.Warn("could not release conditioning; it is freed at its TTL", "key", h.Key, "err", err)
			}
		}()
	}
}
