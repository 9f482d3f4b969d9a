package bench

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/omnipd/omnipd/audio"
)

func msd(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// A text stream as vLLM and omnipd write it: a role chunk that already
// carries the first token, token chunks, the finish chunk, then usage.
func TestStreamParserText(t *testing.T) {
	var rec Record
	p := newStreamParser(&rec, Target{})
	events := []struct {
		at   float64
		data string
	}{
		{40, `{"choices":[{"index":0,"delta":{"role":"assistant","content":"He"},"finish_reason":null}]}`},
		{50, `{"choices":[{"index":0,"delta":{"content":"llo"},"finish_reason":null}]}`},
		{65, `{"choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}`},
		{70, `{"choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"length"}]}`},
		{71, `{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}`},
	}
	for _, e := range events {
		if err := p.event(msd(e.at), []byte(e.data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.finish(); err != nil {
		t.Fatal(err)
	}
	want := Record{Success: true, TextChunks: 4, TTFTMS: 40, ITLMS: []float64{10, 15, 5}, E2EMS: 70,
		OutputTokens: 5, OutputTokensReported: true, PromptTokens: 12, PromptTokensReported: true,
		TPOTMS: 30.0 / 4} // (70 - 40) / (5 - 1)
	if !sameRecord(rec, want) {
		t.Errorf("got  %+v\nwant %+v", rec, want)
	}
	if len(rec.ITLMS) != rec.TextChunks-1 {
		t.Errorf("%d ITLs for %d chunks", len(rec.ITLMS), rec.TextChunks)
	}
}

// Without usage the output length is the number of text chunks; a
// completions stream carries its text in choices[].text.
func TestStreamParserCompletionsWithoutUsage(t *testing.T) {
	var rec Record
	p := newStreamParser(&rec, Target{Endpoint: EndpointCompletions})
	for i, at := range []float64{20, 25, 31} {
		if err := p.event(msd(at), fmt.Appendf(nil, `{"choices":[{"index":0,"text":"t%d","finish_reason":null}]}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.finish(); err != nil {
		t.Fatal(err)
	}
	if rec.OutputTokens != 3 || rec.OutputTokensReported || rec.TTFTMS != 20 || rec.E2EMS != 31 || !near(rec.TPOTMS, 5.5) || !slices.Equal(rec.ITLMS, []float64{5, 6}) {
		t.Errorf("%+v", rec)
	}
}

func wavChunk(t *testing.T, frames int) string {
	t.Helper()
	samples := make([]float32, frames*audio.SamplesPerFrame)
	for i := range samples {
		samples[i] = float32(math.Sin(float64(i) / 10))
	}
	return base64.StdEncoding.EncodeToString(audio.EncodeWAV(samples))
}

// An omni stream: text chunks marked "text", the usage chunk, then audio
// chunks each a small WAV file, then the closing audio chunk.
func TestStreamParserOmni(t *testing.T) {
	var rec Record
	p := newStreamParser(&rec, Target{Audio: true})
	events := []struct {
		at   float64
		data string
	}{
		{30, `{"modality":"text","choices":[{"index":0,"delta":{"role":"assistant","content":"a"},"finish_reason":null}]}`},
		{40, `{"modality":"text","choices":[{"index":0,"delta":{"content":"b"},"finish_reason":null}]}`},
		{41, `{"modality":"text","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`},
		// 5 frames of 80 ms, then 10 more: 1.2 s of audio.
		{100, `{"modality":"audio","choices":[{"index":0,"delta":{"role":"assistant","content":"` + wavChunk(t, 5) + `"},"finish_reason":null}]}`},
		{400, `{"modality":"audio","choices":[{"index":0,"delta":{"content":"` + wavChunk(t, 10) + `"},"finish_reason":null}]}`},
		{401, `{"modality":"audio","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`},
	}
	for _, e := range events {
		if err := p.event(msd(e.at), []byte(e.data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.finish(); err != nil {
		t.Fatal(err)
	}
	if rec.TextChunks != 2 || rec.TTFTMS != 30 || rec.TPOTMS != 10 || !slices.Equal(rec.ITLMS, []float64{10}) {
		t.Errorf("text: %+v", rec)
	}
	if rec.AudioChunks != 2 || rec.AudioTTFPMS != 100 || !near(rec.AudioDurationS, 1.2) || !near(rec.AudioRTF, 0.4/1.2) || rec.E2EMS != 401 {
		t.Errorf("audio: %+v", rec)
	}
}

func TestStreamParserPCM(t *testing.T) {
	var rec Record
	p := newStreamParser(&rec, Target{Audio: true, AudioFormat: "pcm"})
	pcm := base64.StdEncoding.EncodeToString(make([]byte, 2*audio.SampleRate/2)) // half a second
	_ = p.event(msd(10), []byte(`{"modality":"text","choices":[{"delta":{"content":"x"}}]}`))
	if err := p.event(msd(60), []byte(`{"modality":"audio","choices":[{"delta":{"content":"`+pcm+`"}}]}`)); err != nil {
		t.Fatal(err)
	}
	if err := p.finish(); err != nil || !near(rec.AudioDurationS, 0.5) || !near(rec.AudioRTF, 0.12) {
		t.Errorf("%v %+v", err, rec)
	}
}

func TestStreamParserFailures(t *testing.T) {
	for name, tt := range map[string]struct {
		target Target
		events []string
		want   string
	}{
		"error event": {Target{}, []string{
			`{"choices":[{"delta":{"content":"a"}}]}`,
			`{"error":{"message":"the decode stage's stream broke off","type":"upstream_error","code":"decode_stream_failed"}}`,
		}, "stream failed: the decode stage's stream broke off"},
		"audio error event": {Target{Audio: true}, []string{
			`{"modality":"text","choices":[{"delta":{"content":"a"}}]}`,
			`{"modality":"audio","error":{"message":"the audio stages failed: talker: boom","type":"upstream_error"}}`,
		}, "audio failed mid-stream: the audio stages failed"},
		"no text":     {Target{}, []string{`{"choices":[],"usage":{"completion_tokens":0}}`}, "no text choice"},
		"no audio":    {Target{Audio: true}, []string{`{"modality":"text","choices":[{"delta":{"content":"a"}}]}`}, "carried none"},
		"bad audio":   {Target{Audio: true}, []string{`{"modality":"audio","choices":[{"delta":{"content":"UklGRg=="}}]}`}, "audio chunk 1"},
		"not base64":  {Target{Audio: true}, []string{`{"modality":"audio","choices":[{"delta":{"content":"%%%"}}]}`}, "not base64"},
		"not a chunk": {Target{}, []string{`[1,2]`}, "not a completion chunk"},
	} {
		t.Run(name, func(t *testing.T) {
			var rec Record
			p := newStreamParser(&rec, tt.target)
			var err error
			for i, e := range tt.events {
				if err = p.event(msd(float64(10*i)), []byte(e)); err != nil {
					break
				}
			}
			if err == nil {
				err = p.finish()
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) || rec.Success {
				t.Errorf("error %v (success %v); want one containing %q", err, rec.Success, tt.want)
			}
		})
	}
}

// A server that ignored "stream" answers one JSON body: its audio is the
// choice's message.audio.data.
func TestStreamParserWholeResponse(t *testing.T) {
	var rec Record
	p := newStreamParser(&rec, Target{Audio: true})
	body := `{"choices":[{"index":0,"message":{"role":"assistant","content":"hi there"}},{"index":0,"message":{"role":"assistant","content":null,"audio":{"id":"audio-1","data":"` + wavChunk(t, 25) + `"}}}],"usage":{"prompt_tokens":3,"completion_tokens":4}}`
	if err := p.whole(msd(500), []byte(body)); err != nil {
		t.Fatal(err)
	}
	if err := p.finish(); err != nil {
		t.Fatal(err)
	}
	if rec.TTFTMS != 500 || rec.E2EMS != 500 || rec.OutputTokens != 4 || rec.AudioChunks != 1 || !near(rec.AudioDurationS, 2) || !near(rec.AudioRTF, 0.25) {
		t.Errorf("%+v", rec)
	}
}

func sameRecord(a, b Record) bool {
	itl := slices.EqualFunc(a.ITLMS, b.ITLMS, func(x, y float64) bool { return near(x, y) })
	a.ITLMS, b.ITLMS = nil, nil
	ok := near(a.TPOTMS, b.TPOTMS) && near(a.TTFTMS, b.TTFTMS) && near(a.E2EMS, b.E2EMS)
	a.TPOTMS, b.TPOTMS, a.TTFTMS, b.TTFTMS, a.E2EMS, b.E2EMS = 0, 0, 0, 0, 0, 0
	return itl && ok && fmt.Sprint(a) == fmt.Sprint(b)
}

// One WAV split across packets: the header, with a provisional length, in
// the first; bare samples, cut anywhere, after it.
func TestStreamParserSplitWAV(t *testing.T) {
	samples := make([]float32, 24000) // one second
	whole := audio.EncodeWAV(samples)
	header := append([]byte(nil), whole[:44]...)
	binary.LittleEndian.PutUint32(header[4:], 0xFFFFFFFF)
	binary.LittleEndian.PutUint32(header[40:], 0xFFFFFFFF)
	pcm := whole[44:]
	packets := [][]byte{append(header, pcm[:1001]...), pcm[1001:30001], pcm[30001:]}
	var rec Record
	p := newStreamParser(&rec, Target{Audio: true})
	_ = p.event(msd(5), []byte(`{"modality":"text","choices":[{"delta":{"content":"x"}}]}`))
	for i, pk := range packets {
		ev := `{"modality":"audio","choices":[{"delta":{"content":"` + base64.StdEncoding.EncodeToString(pk) + `"}}]}`
		if err := p.event(msd(float64(100*(i+1))), []byte(ev)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.finish(); err != nil || !near(rec.AudioDurationS, 1) || rec.AudioChunks != 3 || !near(rec.AudioRTF, 0.3) {
		t.Errorf("%v %+v", err, rec)
	}
	var bare Record
	q := newStreamParser(&bare, Target{Audio: true})
	if err := q.event(0, []byte(`{"modality":"audio","choices":[{"delta":{"content":"AAAA"}}]}`)); err == nil || !strings.Contains(err.Error(), "neither a WAV") {
		t.Errorf("bare samples with no header before them: %v", err)
	}
}
