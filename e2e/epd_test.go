package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"sync"
	"testing"

	"github.com/omnipd/omnipd/internal/testbed"
)

// mediaWAV is a short 16 kHz mono WAV whose samples depend on seed.
func mediaWAV(seed, samples int) string {
	var b bytes.Buffer
	b.WriteString("RIFF")
	_ = binary.Write(&b, binary.LittleEndian, uint32(36+2*samples))
	b.WriteString("WAVEfmt ")
	for _, v := range []any{uint32(16), uint16(1), uint16(1), uint32(16000), uint32(32000), uint16(2), uint16(16)} {
		_ = binary.Write(&b, binary.LittleEndian, v)
	}
	b.WriteString("data")
	_ = binary.Write(&b, binary.LittleEndian, uint32(2*samples))
	for i := range samples {
		_ = binary.Write(&b, binary.LittleEndian, int16((i*(37+seed))%12000-6000))
	}
	return base64.StdEncoding.EncodeToString(b.Bytes())
}

// mediaPNG is a small picture whose pixels depend on seed, as a data URL.
func mediaPNG(seed int) string {
	img := image.NewRGBA(image.Rect(0, 0, 32, 32))
	for y := range 32 {
		for x := range 32 {
			img.Set(x, y, color.RGBA{uint8(x*8 + seed), uint8(y * 8), uint8(seed * 40), 255})
		}
	}
	var b bytes.Buffer
	_ = png.Encode(&b, img)
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b.Bytes())
}

// mediaChat is a text-only answer to a question with an audio clip and a
// picture.
func mediaChat(i int, stream bool, extra string) string {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":%q,"format":"wav"}},{"type":"image_url","image_url":{"url":%q}},{"type":"text","text":"what is this, %d?"}]}],"max_tokens":6,"stream":%v,"modalities":["text"]`,
		testbed.ModelName, mediaWAV(i%5, 8000), mediaPNG(i%7), i, stream)
	if extra != "" {
		body += "," + extra
	}
	return body + "}"
}

// E/P/D under faults: with two encoders, answers equal PD's; an encoder
// killed under load costs only the requests it held — each a clean error —
// and every request after the kill succeeds, a leg the dead encoder
// refuses going to the other; with one encoder dead and the other stalled,
// requests time out with a 504 naming the encoder, and once it resumes
// they succeed again, none sent to the dead one; afterwards nothing is
// left behind: no encoder outputs, KV, stashes or goroutines.
func TestEPDFaults(t *testing.T) {
	pd := testbed.Start(t, testbed.Options{})
	d := testbed.Start(t, testbed.Options{Encoders: 2, PrefillRetries: 1})
	warm(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 3*reqTimeout)
	defer cancel()
	for i := range 4 {
		body := mediaChat(i, false, `"temperature":0`)
		want, got := send(ctx, pd, chatPath, body), send(ctx, d, chatPath, body)
		if got.status != http.StatusOK || string(got.body) == "" || contentOf(t, got) != contentOf(t, want) {
			t.Errorf("request %d: E/P/D %v; PD %v", i, got, want)
		}
	}

	// Kill one encoder while requests are in flight.
	var wg sync.WaitGroup
	results := make([]answer, 12)
	for i := range results {
		wg.Go(func() { results[i] = send(ctx, d, chatPath, mediaChat(100+i, i%2 == 1, "")) })
		if i == 4 {
			d.Encoder[0].Kill()
		}
	}
	wg.Wait()
	failed := 0
	for i, a := range results {
		if a.status == http.StatusOK {
			if err := wellFormed(a, i%2 == 1); err != nil {
				t.Errorf("request %d: %v", i, err)
			}
			continue
		}
		failed++
		if _, err := openAIError(a.body); err != nil || a.status < 500 {
			t.Errorf("request %d beside a killed encoder: %v (%v)", i, a, err)
		}
	}
	t.Logf("%d of %d requests failed with the killed encoder", failed, len(results))
	// After the kill every request succeeds: one after another, then
	// several at once.
	after := func(d *testbed.Deployment, what string, first, n, together int) {
		t.Helper()
		for i := range n - together {
			if err := wellFormed(send(ctx, d, chatPath, mediaChat(first+i, i%2 == 1, "")), i%2 == 1); err != nil {
				t.Errorf("%s, request %d: %v", what, i, err)
			}
		}
		var wg sync.WaitGroup
		for i := n - together; i < n; i++ {
			wg.Go(func() {
				if err := wellFormed(send(ctx, d, chatPath, mediaChat(first+i, i%2 == 1, "")), i%2 == 1); err != nil {
					t.Errorf("%s, request %d: %v", what, i, err)
				}
			})
		}
		wg.Wait()
	}
	after(d, "after the kill", 200, 6, 3)
	pd.Settled(t, settleWithin)
	d.Settled(t, settleWithin)

	// One encoder dead, the other stalled: its requests time out with the
	// encoder's 504 (the dead one, if tried, refuses the leg and it goes to
	// the stalled one). The prefill timeout bounds each encoder leg; this
	// deployment's is short, and only the stalled encoder reaches it, one
	// request at a time.
	stalled := testbed.Start(t, testbed.Options{Encoders: 2, PrefillRetries: 1, PrefillTimeout: stallIdle})
	warm(t, stalled)
	stalled.Encoder[0].Kill()
	after(stalled, "after the kill, one at a time", 300, 2, 0)
	stalled.Encoder[1].HTTP.Stall()
	cleanError(t, send(ctx, stalled, chatPath, mediaChat(310, false, "")), http.StatusGatewayTimeout, "encoder_upstream_timeout")
	stalled.Encoder[1].HTTP.Resume()
	// Both encoders sat out — the dead one until seen healthy, the quiet
	// one for a while — and the requests still go to the live one.
	after(stalled, "after the stall", 311, 4, 2)
	stalled.Settled(t, settleWithin)
}

// contentOf is a whole answer's text.
func contentOf(t *testing.T, a answer) string {
	t.Helper()
	var c struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(a.body, &c); err != nil || len(c.Choices) == 0 {
		t.Errorf("not a chat answer: %v", a)
		return ""
	}
	return c.Choices[0].Message.Content
}
