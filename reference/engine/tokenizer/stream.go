package tokenizer

// StreamDecoder turns generated ids into text as they arrive. A byte-level token
// may end in the middle of a multi-byte character ("中" can take two or three
// tokens), so Add holds back an incomplete trailing character until a later
// token completes it or proves it broken; every piece it returns is valid UTF-8,
// and the concatenation of all pieces (Flush included) equals Decode of all ids.
// Use one per generation stream; it is not safe for concurrent use.
type StreamDecoder struct {
	t       *Tokenizer
	pending []byte // at most 3 bytes: a character still waiting for its tail
}

// NewStreamDecoder returns a decoder with nothing pending.
func (t *Tokenizer) NewStreamDecoder() *StreamDecoder {
	return &StreamDecoder{t: t, pending: make([]byte, 0, 8)}
}

// Add decodes one more id and returns the text that is now final, possibly "".
func (d *StreamDecoder) Add(id int) string {
	d.pending = d.t.appendTokenBytes(d.pending, id)
	// Everything before the incomplete tail is final: whatever follows cannot
	// change how it decodes, because decoding restarts at every lead byte.
	ready := len(d.pending) - pendingTail(d.pending)
	if ready == 0 {
		return ""
	}
	out := string(appendValidUTF8(nil, d.pending[:ready]))
	d.pending = append(d.pending[:0], d.pending[ready:]...)
	return out
}

// Flush returns what is still held back (an unfinished character becomes
// U+FFFD) and leaves the decoder empty, ready for reuse.
func (d *StreamDecoder) Flush() string {
	if len(d.pending) == 0 {
		return ""
	}
	out := string(appendValidUTF8(nil, d.pending))
	d.pending = d.pending[:0]
	return out
}
