package e2e

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/omnipd/omnipd/internal/testbed"
	"github.com/omnipd/omnipd/orchestrator"
)

// "Killed" here is an in-process worker whose listeners and every open
// connection (HTTP and KV, at the worker and at the proxy in front of it)
// close at once and whose engine stops: what its peers see of a SIGKILL.

// async runs a request in the background; wait returns its answer.
type async struct {
	done chan answer
}

func start(d *testbed.Deployment, path, body string) *async {
	a := &async{done: make(chan answer, 1)}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
		defer cancel()
		a.done <- send(ctx, d, path, body)
	}()
	return a
}

func (a *async) wait(t *testing.T) answer {
	t.Helper()
	select {
	case ans := <-a.done:
		if errors.Is(ans.err, context.DeadlineExceeded) {
			t.Fatalf("the request hung: no answer within %v", reqTimeout)
		}
		return ans
	case <-time.After(reqTimeout + 5*time.Second):
		t.Fatal("the request hung")
		return answer{}
	}
}

// A prefill worker killed while it holds a request: the request is retried
// on the other prefill instance and succeeds; with no other instance it
// ends in a 502 prefill_upstream_unavailable. Unrelated requests succeed
// throughout, and nothing is left on the surviving workers.
func TestPrefillKilledMidRequest(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(streamName(stream)+"/retried", func(t *testing.T) {
			d := testbed.Start(t, testbed.Options{Prefills: 2, PrefillRetries: 1})
			warm(t, d)
			var victim *async
			held := hold(t, d.Prefill, func() { victim = start(d, chatPath, textChat("the victim", 8, stream)) })
			by := startBystanders(d)
			held.Kill()
			a := victim.wait(t)
			if err := wellFormed(a, stream); err != nil {
				t.Errorf("the retried request: %v", err)
			}
			if p := a.header.Get("X-Omnipd-Pd-Path"); p != orchestrator.PathDisaggregated {
				t.Errorf("path %q", p)
			}
			if n := metric(t, d, "omnipd_prefill_retries_total"); n < 1 {
				t.Errorf("%v prefill retries; the killed instance's request was not retried", n)
			}
			by.finish(t)
			d.Settled(t, settleWithin)
		})
		t.Run(streamName(stream)+"/only instance", func(t *testing.T) {
			d := testbed.Start(t, testbed.Options{PrefillRetries: 1})
			warm(t, d)
			var victim *async
			held := hold(t, d.Prefill, func() { victim = start(d, chatPath, textChat("the victim", 8, stream)) })
			held.Kill()
			cleanError(t, victim.wait(t), http.StatusBadGateway, "prefill_upstream_unavailable")
			d.Settled(t, settleWithin)
		})
	}
}

// A decode worker killed mid-generation: a stream already under way ends
// with an error event and [DONE], a whole answer with a 5xx error body.
// Requests on the other decode instance succeed throughout; nothing is left
// on the prefill or the surviving decode.
func TestDecodeKilledMidStream(t *testing.T) {
	t.Run("stream", func(t *testing.T) {
		d := testbed.Start(t, testbed.Options{Decodes: 2})
		warm(t, d)
		s := openStream(t, d, chatPath, longChat("a long story", true))
		for range 3 {
			if !s.until(hasContent) {
				t.Fatal("the stream ended early")
			}
		}
		victim := running(t, d.Decode)
		by := startBystanders(d)
		victim.Kill()
		streamError(t, s.rest(), "decode_stream_failed")
		by.finish(t)
		d.Settled(t, settleWithin)
	})
	t.Run("whole", func(t *testing.T) {
		d := testbed.Start(t, testbed.Options{Decodes: 2})
		warm(t, d)
		a := start(d, chatPath, longChat("a long story", false))
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

func streamName(stream bool) string {
	if stream {
		return "stream"
	}
	return "whole"
}

// The KV side channel cut mid-transfer (push handshake: the decode reaches
// the prefill's side channel through a proxy that closes both ends after
// 4 KiB, mid-block, on a fresh connection, as the pooled ones are closed
// first; blocks go over TCP, not through the shared memory that would
// carry them on this one host): the request ends with a clean error,
// the prefill's lease is released rather than left to expire, and
// concurrent requests succeed.
func TestKVChannelCutMidTransfer(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(streamName(stream), func(t *testing.T) {
			d := testbed.Start(t, testbed.Options{Handshake: "push", NoSharedMemory: true})
			warm(t, d)
			kv := d.Prefill[0].KV
			kv.CloseOpen()
			accepted := kv.Accepted()
			kv.CutNext(4 << 10)
			victim := start(d, chatPath, textChat("the victim", 8, stream))
			waitFor(t, "the decode to reach the KV side channel", func() bool { return kv.Accepted() > accepted })
			by := startBystanders(d)
			a := victim.wait(t)
			if kv.Cuts() != 1 {
				t.Fatalf("%d connections cut; the transfer was not interrupted", kv.Cuts())
			}
			if stream {
				streamError(t, a, "")
			} else {
				cleanError(t, a, http.StatusBadGateway, "decode_upstream_unavailable")
			}
			by.finish(t)
			d.Settled(t, settleWithin)
			if n := d.ExpiredLeases(); n != 0 {
				t.Errorf("%d KV leases expired: the interrupted transfer's blocks waited out their lease", n)
			}
		})
	}
}

// Stages that stall — a proxy in front stops forwarding their answers —
// past the orchestrator's timeouts: the client gets a 504 naming the stage
// or, on a stream already under way, an error event with that code; the
// other instance's requests succeed meanwhile.
func TestStageStalls(t *testing.T) {
	const idle = stallIdle
	t.Run("decode before its first token", func(t *testing.T) {
		d := testbed.Start(t, testbed.Options{Decodes: 2, StageIdleTimeout: idle})
		warm(t, d)
		for _, stream := range []bool{false, true} {
			var victim *async
			held := hold(t, d.Decode, func() { victim = start(d, chatPath, textChat("stalled", 8, stream)) })
			by := startBystanders(d)
			cleanError(t, victim.wait(t), http.StatusGatewayTimeout, "decode_upstream_timeout")
			by.finish(t)
			held.HTTP.Resume()
			d.Settled(t, settleWithin)
		}
	})
	t.Run("decode mid-stream", func(t *testing.T) {
		d := testbed.Start(t, testbed.Options{Decodes: 2, StageIdleTimeout: idle})
		warm(t, d)
		s := openStream(t, d, chatPath, longChat("stalls later", true))
		if !s.until(hasContent) {
			t.Fatal("the stream ended early")
		}
		victim := running(t, d.Decode)
		victim.HTTP.StallResponses()
		by := startBystanders(d)
		streamError(t, s.rest(), "decode_upstream_timeout")
		by.finish(t)
		victim.HTTP.Resume()
		d.Settled(t, settleWithin)
	})
	t.Run("prefill", func(t *testing.T) {
		// The prefill ran and exported; only its answer is lost, so its KV
		// is freed when the lease runs out.
		d := testbed.Start(t, testbed.Options{PrefillTimeout: idle, LeaseSeconds: shortLease})
		warm(t, d)
		d.Prefill[0].HTTP.StallResponses()
		cleanError(t, start(d, chatPath, textChat("stalled", 8, false)).wait(t), http.StatusGatewayTimeout, "prefill_upstream_timeout")
		d.Prefill[0].HTTP.Resume()
		d.Settled(t, settleWithin)
	})
	t.Run("talker", func(t *testing.T) {
		d := testbed.Start(t, testbed.Options{Omni: true, StageIdleTimeout: idle})
		warm(t, d)
		d.Talker.HTTP.StallResponses()
		by := startBystanders(d)
		cleanError(t, start(d, chatPath, chatBody("speak", 6, false, "")).wait(t), http.StatusGatewayTimeout, "talker_upstream_timeout")
		a := start(d, chatPath, chatBody("speak", 6, true, "")).wait(t)
		streamError(t, a, "talker_upstream_timeout")
		if !sawModality(a, "text") {
			t.Errorf("the text was not sent before the audio failed: %v", a)
		}
		by.finish(t)
		d.Talker.HTTP.Resume()
		d.Settled(t, settleWithin)
	})
	t.Run("code2wav", func(t *testing.T) {
		d := testbed.Start(t, testbed.Options{Omni: true, StageIdleTimeout: idle})
		warm(t, d)
		d.Code2Wav.HTTP.StallResponses()
		cleanError(t, start(d, chatPath, chatBody("speak", 6, false, "")).wait(t), http.StatusGatewayTimeout, "code2wav_upstream_timeout")
		streamError(t, start(d, chatPath, chatBody("speak", 6, true, "")).wait(t), "code2wav_upstream_timeout")
		d.Code2Wav.HTTP.Resume()
		d.Settled(t, settleWithin)
	})
}

func sawModality(a answer, modality string) bool {
	for _, ev := range a.events {
		if c := parseChunk(ev); c.Modality == modality && c.Error == nil {
			return true
		}
	}
	return false
}

// A Talker that dies after the text was sent: the stream carries the text,
// then an audio error event, then [DONE]; a whole answer is a 502. Text-only
// requests succeed meanwhile, and no conditioning is left on the Thinkers.
func TestTalkerFailsAfterText(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(streamName(stream), func(t *testing.T) {
			d := testbed.Start(t, testbed.Options{Omni: true})
			warm(t, d)
			d.Talker.HTTP.StallResponses()
			victim := start(d, chatPath, chatBody("speak", 6, stream, ""))
			waitFor(t, "the Talker to be called", func() bool { return d.Talker.HTTP.BytesUp() > 0 })
			by := startBystanders(d)
			d.Talker.Kill()
			a := victim.wait(t)
			if stream {
				streamError(t, a, "audio_failed")
				if !sawModality(a, "text") {
					t.Errorf("no text before the audio error: %v", a)
				}
			} else {
				cleanError(t, a, http.StatusBadGateway, "talker_failed")
			}
			by.finish(t)
			d.Settled(t, settleWithin)
		})
	}
}

// A client that hangs up at each phase of its request: while the prefill
// runs, between prefill and decode (the decode has the request, its first
// token has not reached omnipd), mid-decode, and mid-audio. Nothing is left
// behind, and unrelated requests succeed meanwhile.
func TestClientDisconnects(t *testing.T) {
	t.Run("before the prefill returns", func(t *testing.T) {
		// When the prefill had finished, its exported KV is freed as its
		// lease runs out: nobody learned where it is.
		d := testbed.Start(t, testbed.Options{Prefills: 2, LeaseSeconds: shortLease})
		warm(t, d)
		for _, stream := range []bool{false, true} {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan answer, 1)
			held := hold(t, d.Prefill, func() {
				go func() { done <- send(ctx, d, chatPath, textChat("leaving", 8, stream)) }()
			})
			by := startBystanders(d)
			waitFor(t, "the prefill to run", func() bool {
				st := held.Engine.Stats()
				leased, _ := held.Server.KVStats()
				return st.Running+st.Waiting > 0 || leased > 0
			})
			cancel()
			leftCleanly(t, done)
			by.finish(t)
			held.HTTP.Resume()
			d.Settled(t, settleWithin)
		}
	})
	t.Run("between prefill and decode", func(t *testing.T) {
		d := testbed.Start(t, testbed.Options{Decodes: 2})
		warm(t, d)
		for _, stream := range []bool{false, true} {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan answer, 1)
			held := hold(t, d.Decode, func() {
				go func() { done <- send(ctx, d, chatPath, longChat("leaving", stream)) }()
			})
			by := startBystanders(d)
			waitFor(t, "the decode to take the request", func() bool {
				st := held.Engine.Stats()
				return st.Running+st.Waiting > 0
			})
			cancel()
			leftCleanly(t, done)
			by.finish(t)
			held.HTTP.Resume()
			d.Settled(t, settleWithin)
		}
	})
	t.Run("mid-decode", func(t *testing.T) {
		d := testbed.Start(t, testbed.Options{})
		warm(t, d)
		by := startBystanders(d)
		for i := range 3 {
			s := openStream(t, d, chatPath, longChat("leaving", true))
			for range i + 1 {
				if !s.until(hasContent) {
					t.Fatal("the stream ended before the client left")
				}
			}
			s.close()
		}
		by.finish(t)
		d.Settled(t, settleWithin)
	})
	t.Run("at staggered points, push handshake", func(t *testing.T) {
		// Both legs start together: a client leaving at any point may
		// catch the prefill computing, exporting or pushing.
		d := testbed.Start(t, testbed.Options{Handshake: "push"})
		warm(t, d)
		by := startBystanders(d)
		for i := range 12 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i*20)*time.Millisecond)
			a := send(ctx, d, chatPath, longChat("leaving", i%2 == 0))
			cancel()
			if !errors.Is(a.err, context.DeadlineExceeded) {
				t.Errorf("want the client's own deadline; got %v", a)
			}
		}
		by.finish(t)
		d.Settled(t, settleWithin)
	})
	t.Run("mid-audio", func(t *testing.T) {
		d := testbed.Start(t, testbed.Options{Omni: true})
		warm(t, d)
		by := startBystanders(d)
		for range 2 {
			s := openStream(t, d, chatPath, chatBody("a story with audio", 8, true, ""))
			if !s.until(isAudio) {
				t.Fatal("no audio in the stream")
			}
			s.close()
		}
		by.finish(t)
		d.Settled(t, settleWithin)
	})
}

// leftCleanly waits, bounded, for the request of a client that hung up to
// end with that client's own cancellation.
func leftCleanly(t *testing.T, done <-chan answer) {
	t.Helper()
	select {
	case a := <-done:
		if !errors.Is(a.err, context.Canceled) {
			t.Errorf("want the client's cancellation; got %v", a)
		}
	case <-time.After(reqTimeout):
		t.Fatal("the client's cancellation did not end its request")
	}
}
