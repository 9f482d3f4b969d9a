package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/omnipd/omnipd/internal/testbed"
)

// The fault suite with async chunk on: the Talker reads the decode's rows
// while the decode streams, so a fault in any of the three stages meets the
// others mid-flight. What holds: a decode that dies ends the audio with an
// error and keeps the text sent; a Talker or Code2Wav that fails or stalls
// never holds the text back; a client that leaves stops the audio stages;
// and every stash, growing ones included, is freed.

// spokenChat asks for text and audio; with ignore_eos it runs to maxTokens.
func spokenChat(content string, maxTokens int, stream bool) string {
	return chatBody(content, maxTokens, stream, `"ignore_eos":true,"seed":5`)
}

// textFinished holds for the text's last chunk.
func textFinished(ev json.RawMessage) bool {
	c := parseChunk(ev)
	if c.Modality != "text" {
		return false
	}
	for _, ch := range c.Choices {
		if ch.FinishReason != nil {
			return true
		}
	}
	return false
}

// audioError is the code of the stream's audio error event, "" when it
// has none.
func audioError(a answer) (string, bool) {
	for _, ev := range a.events {
		if c := parseChunk(ev); c.Modality == "audio" && c.Error != nil {
			if c.Error.Code == nil {
				return "", true
			}
			return *c.Error.Code, true
		}
	}
	return "", false
}

func audioFinished(a answer) bool {
	for _, ev := range a.events {
		if c := parseChunk(ev); c.Modality == "audio" {
			for _, ch := range c.Choices {
				if ch.FinishReason != nil {
					return true
				}
			}
		}
	}
	return false
}

// textKeptAudioFailed checks a stream whose audio failed while the text
// went on: the text finished, the audio ended with an error event with
// code (when not empty) and no finish reason, and [DONE] came.
func textKeptAudioFailed(t *testing.T, a answer, code string) {
	t.Helper()
	if a.err != nil || a.status != http.StatusOK || !a.done {
		t.Fatalf("want a stream ended by [DONE]; got %v", a)
	}
	finished := false
	for _, ev := range a.events {
		finished = finished || textFinished(ev)
	}
	if !finished {
		t.Errorf("the text did not finish: %v", a)
	}
	got, ok := audioError(a)
	if !ok {
		t.Errorf("no audio error event: %v", a)
	} else if code != "" && got != code {
		t.Errorf("audio error code %q, want %q", got, code)
	}
	if audioFinished(a) {
		t.Errorf("the failed audio carries a finish reason: %v", a)
	}
}

func asyncOmni(t *testing.T, o testbed.Options) *testbed.Deployment {
	t.Helper()
	o.Omni, o.AsyncChunk = true, true
	d := testbed.Start(t, o)
	warm(t, d)
	return d
}

// A decode killed mid-answer while the Talker reads its growing stash: a
// stream keeps the text and audio sent, the audio gets no finish reason and
// the stream ends with an error event; a whole answer is a 5xx. The
// Talker's reads of the dead worker's stash end, and nothing is left.
func TestAsyncChunkDecodeKilled(t *testing.T) {
	t.Run("stream", func(t *testing.T) {
		d := asyncOmni(t, testbed.Options{Decodes: 2})
		s := openStream(t, d, chatPath, spokenChat("a long story", 20000, true))
		if !s.until(isAudio) {
			t.Fatal("the stream ended with no audio")
		}
		victim := running(t, d.Decode)
		by := startBystanders(d)
		victim.Kill()
		a := s.rest()
		streamError(t, a, "decode_stream_failed")
		if !sawModality(a, "text") || !sawModality(a, "audio") {
			t.Errorf("the text and audio sent before the decode died are missing: %v", a)
		}
		if audioFinished(a) {
			t.Errorf("the audio of a failed decode carries a finish reason: %v", a)
		}
		by.finish(t)
		d.Settled(t, settleWithin)
	})
	t.Run("whole", func(t *testing.T) {
		d := asyncOmni(t, testbed.Options{Decodes: 2})
		a := start(d, chatPath, spokenChat("a long story", 20000, false))
		victim := running(t, d.Decode)
		by := startBystanders(d)
		victim.Kill()
		ans := a.wait(t)
		if ans.status != http.StatusBadGateway && ans.status != http.StatusServiceUnavailable {
			t.Errorf("want 502 or 503; got %v", ans)
		}
		cleanError(t, ans, ans.status, "")
		by.finish(t)
		d.Settled(t, settleWithin)
	})
}

// A decode that stalls mid-answer — its answers, the Talker's reads of its
// stash among them, stop coming — past the stage idle timeout: the stream
// keeps what was sent and ends with decode_upstream_timeout; the audio gets
// no finish reason, and nothing is left once the decode resumes.
func TestAsyncChunkDecodeStalls(t *testing.T) {
	d := asyncOmni(t, testbed.Options{Decodes: 2, StageIdleTimeout: stallIdle})
	s := openStream(t, d, chatPath, spokenChat("stalls later", 20000, true))
	if !s.until(isAudio) {
		t.Fatal("the stream ended with no audio")
	}
	victim := running(t, d.Decode)
	victim.HTTP.StallResponses()
	by := startBystanders(d)
	a := s.rest()
	streamError(t, a, "decode_upstream_timeout")
	if audioFinished(a) {
		t.Errorf("the audio of a stalled decode carries a finish reason: %v", a)
	}
	by.finish(t)
	victim.HTTP.Resume()
	d.Settled(t, settleWithin)
}

// A Talker that falls behind — its answers stall and never come — does not
// hold the text back: the text streams to its end while the Talker request
// is in flight; once the Talker resumes the audio completes.
func TestAsyncChunkTalkerStallsTextStreamsOn(t *testing.T) {
	d := asyncOmni(t, testbed.Options{})
	d.Talker.HTTP.StallResponses()
	s := openStream(t, d, chatPath, spokenChat("stall the voice", 80, true))
	waitFor(t, "the Talker to be called", func() bool { return d.Talker.HTTP.BytesUp() > 0 })
	if !s.until(textFinished) {
		t.Fatal("the stream ended before the text finished")
	}
	for _, ev := range s.seen {
		if isAudio(ev) {
			t.Fatalf("audio came through a stalled Talker: %s", ev)
		}
	}
	d.Talker.HTTP.Resume()
	if err := wellFormed(s.rest(), true); err != nil {
		t.Error(err)
	}
	d.Settled(t, settleWithin)
}

// The audio stages stall past the stage idle timeout: a whole answer is a
// 504 naming the stage; a stream keeps the whole text and ends the audio
// with an error event with that code. With async chunk the Talker's first
// frame waits for the decode's rows, and the Talker's leg is timed by the
// same idle timeout, which leaves it room for that wait.
func TestAsyncChunkStageStalls(t *testing.T) {
	for _, stage := range []string{"talker", "code2wav"} {
		t.Run(stage, func(t *testing.T) {
			d := asyncOmni(t, testbed.Options{StageIdleTimeout: stallIdle})
			p := d.Talker.HTTP
			if stage == "code2wav" {
				p = d.Code2Wav.HTTP
			}
			p.StallResponses()
			by := startBystanders(d)
			cleanError(t, start(d, chatPath, spokenChat("speak", 6, false)).wait(t), http.StatusGatewayTimeout, stage+"_upstream_timeout")
			textKeptAudioFailed(t, start(d, chatPath, spokenChat("speak", 40, true)).wait(t), stage+"_upstream_timeout")
			by.finish(t)
			p.Resume()
			d.Settled(t, settleWithin)
		})
	}
}

// The Talker or Code2Wav killed mid-audio while the decode still streams:
// the text goes on to its end, the audio ends with an error event, and the
// decode's growing stash is freed although the Talker that held it died.
func TestAsyncChunkAudioStageKilled(t *testing.T) {
	for _, stage := range []string{"talker", "code2wav"} {
		t.Run(stage, func(t *testing.T) {
			d := asyncOmni(t, testbed.Options{})
			victim := d.Talker
			if stage == "code2wav" {
				victim = d.Code2Wav
			}
			s := openStream(t, d, chatPath, spokenChat("a story with audio", 300, true))
			if !s.until(isAudio) {
				t.Fatal("the stream ended with no audio")
			}
			by := startBystanders(d)
			victim.Kill()
			textKeptAudioFailed(t, s.rest(), "")
			by.finish(t)
			d.Settled(t, settleWithin)
		})
	}
	t.Run("talker, whole", func(t *testing.T) {
		d := asyncOmni(t, testbed.Options{})
		d.Talker.HTTP.StallResponses()
		victim := start(d, chatPath, spokenChat("speak", 60, false))
		waitFor(t, "the Talker to be called", func() bool { return d.Talker.HTTP.BytesUp() > 0 })
		d.Talker.Kill()
		cleanError(t, victim.wait(t), http.StatusBadGateway, "talker_failed")
		d.Settled(t, settleWithin)
	})
}

// A client that leaves while the Talker runs stops the Talker and Code2Wav
// work for its request, streamed or whole, and its stashes are freed.
func TestAsyncChunkClientLeaves(t *testing.T) {
	t.Run("stream, mid-audio", func(t *testing.T) {
		d := asyncOmni(t, testbed.Options{})
		by := startBystanders(d)
		for range 2 {
			s := openStream(t, d, chatPath, spokenChat("leaving", 20000, true))
			if !s.until(isAudio) {
				t.Fatal("no audio in the stream")
			}
			s.close()
		}
		by.finish(t)
		d.Settled(t, settleWithin)
	})
	t.Run("stream, Talker stalled", func(t *testing.T) {
		d := asyncOmni(t, testbed.Options{})
		d.Talker.HTTP.StallResponses()
		s := openStream(t, d, chatPath, spokenChat("leaving", 20000, true))
		waitFor(t, "the Talker to be called", func() bool { return d.Talker.HTTP.BytesUp() > 0 })
		if !s.until(hasContent) {
			t.Fatal("no text in the stream")
		}
		s.close()
		waitFor(t, "the Talker's connection to close", func() bool { return d.Talker.HTTP.Open() == 0 })
		d.Talker.HTTP.Resume()
		d.Settled(t, settleWithin)
	})
	t.Run("whole, during the Talker", func(t *testing.T) {
		d := asyncOmni(t, testbed.Options{})
		d.Talker.HTTP.StallResponses()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan answer, 1)
		go func() { done <- send(ctx, d, chatPath, spokenChat("leaving", 60, false)) }()
		waitFor(t, "the Talker to be called", func() bool { return d.Talker.HTTP.BytesUp() > 0 })
		cancel()
		leftCleanly(t, done)
		waitFor(t, "the Talker's connection to close", func() bool { return d.Talker.HTTP.Open() == 0 })
		d.Talker.HTTP.Resume()
		d.Settled(t, settleWithin)
	})
}
