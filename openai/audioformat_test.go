package openai_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/reference/engine/audioproc"
)

// The input_audio formats a request may declare are the ones the reference
// engine decodes, and the refusal of any other names exactly them: "amr",
// once in the list, was then refused by the decoder as unsupported.
func TestInputAudioFormatsAreTheDecodedOnes(t *testing.T) {
	formats := openai.InputAudioFormats()
	for _, f := range formats {
		if _, err := audioproc.ParseFormat(f); err != nil {
			t.Errorf("input_audio format %q is accepted but not decoded: %v", f, err)
		}
	}
	for _, f := range []string{"amr", "flac", "ogg", "WAV"} {
		body := fmt.Sprintf(`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":%q}}]}]}`, f)
		req, err := openai.DecodeChatRequest(strings.NewReader(body), 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		_, err = openai.MediaItems(req, 1<<20)
		var re *openai.RequestError
		if !errors.As(err, &re) || re.Param != "messages[0].content[0].input_audio.format" {
			t.Errorf("format %q: %v, want a refusal of input_audio.format", f, err)
			continue
		}
		if want := "want " + strings.Join(formats, " or "); !strings.HasSuffix(re.Message, want) {
			t.Errorf("format %q: %q, want it to end %q", f, re.Message, want)
		}
	}
}
