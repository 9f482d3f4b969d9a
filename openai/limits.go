package openai

import "math"

// How large a request body may be: sized from the media limits, so that
// every prompt they allow also fits the body cap (docs/security.md §6).

// DefaultMaxMediaItemBytes is the largest media item by default: vLLM's
// VLLM_MAX_AUDIO_CLIP_FILESIZE_MB (25), the tightest of its media size
// limits, and mediafetch.DefaultMaxBytes.
const DefaultMaxMediaItemBytes int64 = 25 << 20

// BodyTextRoom is the room a request body has for everything but its
// inline media — messages, tools, sampling parameters. It is what the
// body cap was before media came inline: far more text than any context
// holds, since a text longer than the context is refused without being
// tokenized.
const BodyTextRoom int64 = 16 << 20

// mediaPartRoom is what one media part's JSON adds to its base64 payload:
// the part's type, keys and format, a data URL's scheme and MIME type.
const mediaPartRoom = 1 << 10

// MaxBodyBytes is the request body cap that admits every prompt the media
// limits allow: BodyTextRoom, plus for every media item a prompt may carry
// its largest inline form — maxItemBytes (<= 0: DefaultMaxMediaItemBytes)
// as base64 (4 bytes for every 3), a sixteenth more for what a JSON encoder
// may add to base64 (line breaks written as \n, "/" written as "\/"), and
// mediaPartRoom for the part around it.
//
// The items a prompt may carry are the audio, image and video counts of
// limits; a modality limits does not name counts as one item: vLLM's
// default of DefaultMediaLimit per modality would make the cap unbounded,
// so a deployment that takes several large items names their count in
// --limit-mm-per-prompt.
func MaxBodyBytes(maxItemBytes int64, limits MediaLimits) int64 {
	if maxItemBytes <= 0 {
		maxItemBytes = DefaultMaxMediaItemBytes
	}
	encoded := satMul((maxItemBytes+2)/3, 4)
	item := satAdd(satAdd(encoded, (encoded+15)/16), mediaPartRoom)
	var items int64
	for _, kind := range []MediaKind{MediaAudio, MediaImage, MediaVideo} {
		n, named := limits[kind]
		if !named {
			n = 1
		}
		items = satAdd(items, int64(n))
	}
	return satAdd(BodyTextRoom, satMul(items, item))
}

// legRoom is what omnipd adds to a client's request on a stage leg: its
// kv_transfer_params (a NIXL handoff lists the prompt's block ids), the
// conditioning and encoder-output handles.
const legRoom = 1 << 20

// MaxLegBodyBytes bounds the body of a Thinker leg omnipd sends for a
// client request of at most clientBody bytes, so that stage workers can be
// given a cap no leg exceeds. A leg is the client's request decoded and
// encoded again, plus legRoom: re-encoding a string turns each byte that is
// not UTF-8 into U+FFFD, three bytes, and grows nothing else by more (a raw
// U+2028, three bytes, becomes the six of its escape), so a leg is at most
// three times the client's body.
func MaxLegBodyBytes(clientBody int64) int64 {
	return satAdd(satMul(clientBody, 3), legRoom)
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func satMul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}
