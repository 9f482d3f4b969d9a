package worker

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
)

// wav16k is a 16-bit mono WAV at 16 kHz of the given samples, the rate the
// feature extractor reads, so that no resampling adds to the test's work.
func wav16k(samples int) []byte {
	b := make([]byte, 44+2*samples)
	copy(b, "RIFF")
	binary.LittleEndian.PutUint32(b[4:], uint32(36+2*samples))
	copy(b[8:], "WAVEfmt ")
	binary.LittleEndian.PutUint32(b[16:], 16)
	binary.LittleEndian.PutUint16(b[20:], 1) // PCM
	binary.LittleEndian.PutUint16(b[22:], 1) // mono
	binary.LittleEndian.PutUint32(b[24:], 16000)
	binary.LittleEndian.PutUint32(b[28:], 32000)
	binary.LittleEndian.PutUint16(b[32:], 2)
	binary.LittleEndian.PutUint16(b[34:], 16)
	copy(b[36:], "data")
	binary.LittleEndian.PutUint32(b[40:], uint32(2*samples))
	for i := range samples {
		binary.LittleEndian.PutUint16(b[44+2*i:], uint16(int16(i*37%20000-10000)))
	}
	return b
}

// The audio encoder takes at most 300 s of audio (its 30000 mel frames). A
// longer clip is the client's input: a 400 naming the part and the limit in
// seconds, answered before anything of the clip is decoded or encoded — by
// a Thinker worker, whose prefill would otherwise fail with a 500 that
// under PD is retried and ends as a 502, and by an encoder worker. A clip
// of exactly 300 s is encoded: 3900 placeholder rows.
func TestAudioPastTheEncoderLimitIsRefused(t *testing.T) {
	const limit = 300 * 16000 // samples at 16 kHz
	chat := func(clip []byte) string {
		return fmt.Sprintf(`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":%q,"format":"wav"}},{"type":"text","text":"what is it?"}]}],"max_tokens":1}`, b64(clip))
	}
	thinker := newTestWorker(t, "")
	encoderWorker := newTestWorkerWith(t, "", func(c *Config) { c.EC = &ECTransferConfig{Connector: ReferenceECConnector, Role: ECProducer} })

	over := chat(wav16k(limit + 1))
	for name, w := range map[string]*testWorker{"thinker": thinker, "encoder": encoderWorker} {
		status, _, b := do(t, "POST", w.url+"/v1/chat/completions", over)
		var e struct {
			Error struct {
				Message, Type string
				Param         *string
			} `json:"error"`
		}
		const part, want = "messages[0].content[0]", "messages[0].content[0].input_audio: the audio lasts 300.0001 s, over the limit of 300 s"
		if status != http.StatusBadRequest || json.Unmarshal([]byte(b), &e) != nil || e.Error.Type != "invalid_request_error" ||
			e.Error.Param == nil || *e.Error.Param != part || e.Error.Message != want {
			t.Errorf("%s worker, a clip one sample over 300 s: %d %.400s; want 400 on %s, %q", name, status, b, part, want)
		}
		exp := scrape(t, w.url)
		if runs := metricValue(t, exp, `omnipd_encoder_runs_total{modality="audio",model_name="omnipd-reference"}`); runs != 0 {
			t.Errorf("%s worker ran the audio encoder %v times for a refused clip", name, runs)
		}
		if st := w.eng.Stats(); st.PromptTokensComputed != 0 {
			t.Errorf("%s worker: a refused clip reached the engine: %+v", name, st)
		}
	}

	status, _, b := do(t, "POST", encoderWorker.url+"/v1/chat/completions", chat(wav16k(limit)))
	var ans struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
		Kept []EncoderCacheHandle `json:"omnipd_encoder_cache"`
	}
	if status != http.StatusOK || json.Unmarshal([]byte(b), &ans) != nil || len(ans.Kept) != 1 || ans.Usage.PromptTokens != 3900 {
		t.Errorf("a clip of exactly 300 s at the encoder: %d %.400s; want it encoded into 3900 rows", status, b)
	}
}

// The vision encoder takes at most 16384 patches (one 2048×2048 image). A
// larger image is the client's input too: a 400 naming the part and the
// limit, before it is resized, patched or encoded.
func TestImagePastTheEncoderLimitIsRefused(t *testing.T) {
	w := newTestWorker(t, "")
	body := fmt.Sprintf(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,%s"}}]}],"max_tokens":1}`, b64(pngBytes(2080, 2080)))
	status, _, b := do(t, "POST", w.url+"/v1/chat/completions", body)
	var e struct {
		Error struct {
			Message string
			Param   *string
		} `json:"error"`
	}
	const part, want = "messages[0].content[0]", "messages[0].content[0].image_url: resized to 2080×2080 it makes 16900 patches, over the limit of 16384"
	if status != http.StatusBadRequest || json.Unmarshal([]byte(b), &e) != nil || e.Error.Param == nil || *e.Error.Param != part || e.Error.Message != want {
		t.Errorf("a 2080×2080 image: %d %.400s; want 400 on %s, %q", status, b, part, want)
	}
	if st := w.eng.Stats(); st.PromptTokensComputed != 0 {
		t.Errorf("a refused image reached the engine: %+v", st)
	}
}
