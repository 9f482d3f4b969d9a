package openai

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// tokenIDsBody is a completions body whose prompt is n token ids.
func tokenIDsBody(n int, batch bool) []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"m","max_tokens":4,"prompt":`)
	if batch {
		b.WriteString(`[[1,2],`)
	}
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(i % 10))
	}
	b.WriteByte(']')
	if batch {
		b.WriteByte(']')
	}
	b.WriteByte('}')
	return b.Bytes()
}

// A token-id prompt that cannot fit the context is refused with vLLM's 400
// (context_length_exceeded, naming both counts) before its ids are decoded:
// what decoding a 15 MiB body of ids allocates stays near the body's own
// copy, where decoding them costs eight bytes an id (~60 MB). One id fewer
// than the context still decodes.
func TestTokenPromptLongerThanTheContextIsRefusedUndecoded(t *testing.T) {
	const maxModelLen = 32768
	huge := tokenIDsBody(15<<20/2, false) // ids of one digit and a comma
	allocated := func(body []byte) (uint64, error) {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err := DecodeCompletionRequestWithin(bytes.NewReader(body), 64<<20, maxModelLen)
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc, err
	}
	// The yardstick: a text prompt of the same size, which costs the body
	// read (io.ReadAll grows a copy) and one copy of its text.
	text := append(append([]byte(`{"model":"m","max_tokens":4,"prompt":"`), bytes.Repeat([]byte("a"), len(huge)-len(`{"model":"m","max_tokens":4,"prompt":""}`))...), `"}`...)
	yardstick, err := allocated(text)
	if err != nil {
		t.Fatal(err)
	}
	alloc, err := allocated(huge)
	if alloc > yardstick {
		t.Errorf("refusing %d bytes of token ids allocated %d MB, more than decoding a text prompt of that size (%d MB)", len(huge), alloc>>20, yardstick>>20)
	}
	var resp *ErrorResponse
	if !errors.As(err, &resp) || resp.Status != 400 || resp.Detail.Code == nil || *resp.Detail.Code != CodeContextLengthExceeded ||
		resp.Detail.Param == nil || *resp.Detail.Param != "prompt" ||
		!strings.Contains(resp.Detail.Message, fmt.Sprintf("maximum context length is %d tokens. However, your request has %d input tokens", maxModelLen, 15<<20/2)) {
		t.Fatalf("a prompt of %d ids with a context of %d: %v, want vLLM's context_length_exceeded naming both", 15<<20/2, maxModelLen, err)
	}

	for _, c := range []struct {
		name  string
		body  []byte
		param string // "" for a prompt that fits
	}{
		{"the longest that fits", tokenIDsBody(maxModelLen-1, false), ""},
		{"one id too many", tokenIDsBody(maxModelLen, false), "prompt"},
		{"in a batch", tokenIDsBody(maxModelLen, true), "prompt[1]"},
		{"a text prompt is left to the tokenizer", []byte(`{"prompt":"` + strings.Repeat("a ", maxModelLen) + `"}`), ""},
	} {
		req, err := DecodeCompletionRequestWithin(bytes.NewReader(c.body), 64<<20, maxModelLen)
		var resp *ErrorResponse
		switch {
		case c.param == "" && (err != nil || req.Prompt == nil):
			t.Errorf("%s: %v, want it decoded", c.name, err)
		case c.param != "" && (!errors.As(err, &resp) || *resp.Detail.Param != c.param || *resp.Detail.Code != CodeContextLengthExceeded):
			t.Errorf("%s: %v, want context_length_exceeded on %s", c.name, err, c.param)
		}
	}
	// Without a known context, or with a malformed body, it decodes as
	// DecodeCompletionRequest does.
	if _, err := DecodeCompletionRequestWithin(bytes.NewReader(tokenIDsBody(100, false)), 1<<20, 0); err != nil {
		t.Errorf("no context known: %v", err)
	}
	_, want := DecodeCompletionRequest(strings.NewReader(`{"prompt":[1,2,}`), 1<<20)
	if _, err := DecodeCompletionRequestWithin(strings.NewReader(`{"prompt":[1,2,}`), 1<<20, 10); err == nil || err.Error() != want.Error() {
		t.Errorf("malformed body: %v, want %v", err, want)
	}
}

// The body cap holds every prompt the media limits allow: a 10-minute
// 16 kHz WAV inline (the clip vLLM's 25 MiB item limit is there for), one
// item of each modality at the item limit by default, and as many as
// --limit-mm-per-prompt names; and a Thinker leg of any body within it
// fits MaxLegBodyBytes.
func TestMaxBodyBytesHoldsWhatTheMediaLimitsAllow(t *testing.T) {
	body := func(items int, itemBytes int) []byte {
		data := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x5a}, itemBytes))
		var parts []map[string]any
		for range items {
			parts = append(parts, map[string]any{"type": "input_audio", "input_audio": map[string]any{"data": data, "format": "wav"}})
		}
		parts = append(parts, map[string]any{"type": "text", "text": "What is said?"})
		b, err := json.Marshal(map[string]any{"messages": []map[string]any{{"role": "user", "content": parts}}, "max_tokens": 16})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tenMinutes := 44 + 600*16000*2
	if b := body(1, tenMinutes); int64(len(b)) > MaxBodyBytes(0, nil) {
		t.Errorf("a 10-minute 16 kHz WAV inline is %d bytes, over the default cap %d", len(b), MaxBodyBytes(0, nil))
	}
	limit := int(DefaultMaxMediaItemBytes)
	if b := body(3, limit); int64(len(b)) > MaxBodyBytes(0, nil) {
		t.Errorf("three items at the item limit are %d bytes, over the default cap %d", len(b), MaxBodyBytes(0, nil))
	}
	limits, err := ParseMediaLimits(`{"audio": 5, "image": 0, "video": 0}`)
	if err != nil {
		t.Fatal(err)
	}
	if b := body(5, limit); int64(len(b)) > MaxBodyBytes(0, limits) {
		t.Errorf("five items at the item limit are %d bytes, over the cap %d for a limit of five", len(b), MaxBodyBytes(0, limits))
	}
	if MaxBodyBytes(0, limits) >= MaxBodyBytes(0, nil)*2 || MaxBodyBytes(1<<20, limits) >= MaxBodyBytes(0, limits) {
		t.Errorf("the cap does not follow the limits: %d (5 audio), %d (default), %d (5 audio of 1 MiB)", MaxBodyBytes(0, limits), MaxBodyBytes(0, nil), MaxBodyBytes(1<<20, limits))
	}
	if got := MaxBodyBytes(1<<40, MediaLimits{MediaAudio: 1 << 30}); got <= 0 {
		t.Errorf("an enormous limit overflowed to %d", got)
	}

	// A leg is the request decoded and encoded again: text with bytes that
	// are not UTF-8 grows the most.
	worst := []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("\xff", 1<<20) + `"}]}`)
	req, err := DecodeChatRequest(bytes.NewReader(worst), 0)
	if err != nil {
		t.Fatal(err)
	}
	leg, err := req.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(leg)) > MaxLegBodyBytes(int64(len(worst))) || int64(len(leg)) < 2*int64(len(worst)) {
		t.Errorf("a %d-byte body re-encoded as %d bytes; MaxLegBodyBytes says %d", len(worst), len(leg), MaxLegBodyBytes(int64(len(worst))))
	}
}
