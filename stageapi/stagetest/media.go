package stagetest

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"net/http"

	"github.com/omnipd/omnipd/stageapi"
)

// wavClip is a mono 16-bit PCM WAV of a tone, seconds long at rate.
func wavClip(seconds float64, rate int) []byte {
	n := int(seconds * float64(rate))
	var b bytes.Buffer
	le := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	b.WriteString("RIFF")
	le(uint32(36 + 2*n))
	b.WriteString("WAVEfmt ")
	le(uint32(16))
	le(uint16(1)) // PCM
	le(uint16(1)) // mono
	le(uint32(rate))
	le(uint32(2 * rate))
	le(uint16(2))
	le(uint16(16))
	b.WriteString("data")
	le(uint32(2 * n))
	for i := range n {
		le(int16(9000 * math.Sin(2*math.Pi*440*float64(i)/float64(rate))))
	}
	return b.Bytes()
}

// pngImage is an RGB PNG whose pixels depend on seed.
func pngImage(width, height int, seed uint8) []byte {
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	for y := range height {
		for x := range width {
			img.Set(x, y, color.RGBA{uint8(x*7) + seed, uint8(y*13) + seed, uint8(x+y) ^ seed, 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		panic(fmt.Sprintf("stagetest: encoding a PNG: %v", err))
	}
	return b.Bytes()
}

// mediaChat is a chat of one user turn: a text part, then parts.
func (c *checker) mediaChat(maxTokens int, parts ...map[string]any) map[string]any {
	content := []map[string]any{{"type": "text", "text": "What do you hear and see?"}}
	content = append(content, parts...)
	return map[string]any{"model": c.d.Model, "messages": []map[string]any{{"role": "user", "content": content}},
		"max_tokens": maxTokens, "temperature": 0.0}
}

func audioPart(wav []byte) map[string]any {
	return map[string]any{"type": "input_audio", "input_audio": map[string]any{
		"data": base64.StdEncoding.EncodeToString(wav), "format": "wav"}}
}

func imagePart(data []byte) map[string]any {
	return map[string]any{"type": "image_url", "image_url": map[string]any{
		"url": "data:image/png;base64," + base64.StdEncoding.EncodeToString(data)}}
}

// checkMedia: a chat with a WAV (input_audio) and a PNG (an image_url data
// URL) is accepted; its prompt_tokens count the processor's placeholders
// (more than the text-only chat's); another image changes the Thinker's
// rows; a prefill/decode pair answers the colocated text and its rows
// merge into the colocated rows bit for bit; an undecodable image is a 400
// naming the part, and the instance serves on.
func checkMedia(c *checker) {
	base := c.thinker()
	clip := audioPart(wavClip(0.5, 16000))
	pictures := [2]map[string]any{imagePart(pngImage(56, 56, 1)), imagePart(pngImage(56, 56, 2))}
	const maxTokens = 6

	textOnly := c.generate(base, "the chat without its media", c.mediaChat(maxTokens))
	body := c.mediaChat(maxTokens, clip, pictures[0])
	want := c.generate(base, "a chat with a WAV and a PNG", c.keep(body, "media/thinker", false))
	if want.Usage.PromptTokens <= textOnly.Usage.PromptTokens {
		c.Errorf("a chat with an audio clip and an image: prompt_tokens %d; the same chat without them %d: the media's placeholders are not counted",
			want.Usage.PromptTokens, textOnly.Usage.PromptTokens)
	}
	ref := c.fetch(base, "media/thinker")
	if p := want.Usage.PromptTokens; len(ref.PromptTokenIDs) != p {
		c.Errorf("the stash of a chat with media holds %d prompt ids; usage.prompt_tokens says %d", len(ref.PromptTokenIDs), p)
	}

	// Another image of the same size: the same placeholders, other rows.
	other := c.generate(base, "the chat with another image", c.keep(c.mediaChat(maxTokens, clip, pictures[1]), "media/other", false))
	alt := c.fetch(base, "media/other")
	if other.Usage.PromptTokens == want.Usage.PromptTokens {
		if ok, _ := rowsEqual(alt.Hidden, ref.Hidden); ok {
			c.Errorf("another image left the Thinker's rows unchanged: the image reached no placeholder")
		}
	}

	if c.d.PD != nil {
		pair := c.pair()
		got := c.prefillDecode(pair, "media-pd", body,
			map[string]any{"omnipd_conditioning": map[string]any{"key": "media-pd/prefill", "layer": c.d.Layer}},
			map[string]any{"omnipd_conditioning": map[string]any{"key": "media-pd/decode", "layer": c.d.Layer}})
		what := pair.KV.Name() + ", a chat with media"
		if got.decode.text() != want.text() {
			c.Errorf("%s: the decode answers %q; colocated %q", what, got.decode.text(), want.text())
		}
		if *got.decode.Usage != *want.Usage {
			c.Errorf("%s: the decode's usage %+v; colocated %+v", what, *got.decode.Usage, *want.Usage)
		}
		if got.prefill.Usage.PromptTokens != want.Usage.PromptTokens {
			c.Errorf("%s: the prefill counts %d prompt tokens; colocated %d", what, got.prefill.Usage.PromptTokens, want.Usage.PromptTokens)
		}
		pre, dec := c.fetch(pair.Prefill, "media-pd/prefill"), c.fetch(pair.Decode, "media-pd/decode")
		merged, err := stageapi.MergeConditioning(pre, dec)
		switch {
		case err != nil:
			c.Errorf("%s: prefill and decode stashes do not merge: %v", what, err)
		default:
			if ok, where := rowsEqual(merged.Embed, ref.Embed); !ok {
				c.Errorf("%s: prefill[0:P] ++ decode[1:] layer-0 rows differ from colocated: %s", what, where)
			}
			if ok, where := rowsEqual(merged.Hidden, ref.Hidden); !ok {
				c.Errorf("%s: prefill[0:P] ++ decode[1:] hidden rows differ from colocated: %s", what, where)
			}
		}
	}

	// An image that is no image: the client's 400, naming the part (the
	// third of the turn) or at least the messages.
	bad := c.mediaChat(maxTokens, clip, imagePart([]byte("these bytes are no image")))
	r := c.post(base+"/v1/chat/completions", bad)
	const part = "messages[0].content[2]"
	if r.status != http.StatusBadRequest {
		c.Errorf("an undecodable image: %v; want 400", r)
	} else if e, err := openAIError(r); err != nil {
		c.Errorf("an undecodable image: %v: %s", err, r)
	} else if p := e.param(); p != part && p != "messages" {
		c.Errorf("an undecodable image: param %q; want %q (or at least \"messages\")", p, part)
	}
	if again := c.generate(base, "the chat after the refused one", body); again.text() != want.text() {
		c.Errorf("after a refused image the same chat answers %q; before it %q", again.text(), want.text())
	}
	c.wantStashes(base, 0, "after every stash was read")
}
