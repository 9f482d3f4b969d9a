package openai

// Multimodal input, as vLLM reads it from a chat request.
//
// The request types keep every non-text content part raw in
// ContentPart.Extra so that a forwarded body loses nothing. This file reads
// those raw parts the way vLLM's chat_utils.py does, so omnipd can count,
// bound and resolve media before any stage sees the request: MediaItems lists
// the media parts in order, MediaLimits checks them against
// --limit-mm-per-prompt, and ParseMMProcessorKwargs reads the one processor
// option that changes what a part means (use_audio_in_video). Nothing here
// fetches or decodes media; package mediafetch does that.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// MediaKind is a modality of media input, spelled as vLLM spells it in
// --limit-mm-per-prompt and in its per-prompt item counts.
type MediaKind string

const (
	MediaAudio MediaKind = "audio"
	MediaImage MediaKind = "image"
	MediaVideo MediaKind = "video"
)

// Content part types that carry media, as vLLM names them.
const (
	PartImageURL   = "image_url"
	PartInputImage = "input_image"
	PartAudioURL   = "audio_url"
	PartInputAudio = "input_audio"
	PartVideoURL   = "video_url"
)

// ErrMediaTooLarge is wrapped by the RequestError for an inline or data-URL
// payload whose encoded length already implies more bytes than allowed, so
// the caller can tell it from a malformed part.
var ErrMediaTooLarge = errors.New("media item too large")

// MediaItem is one media part of a chat request, not yet fetched or decoded.
// Exactly one of URL and Data is set.
type MediaItem struct {
	// Path locates the part in the request body, "messages[i].content[j]";
	// errors about the item name it.
	Path string
	Kind MediaKind
	// PartType is the part's type; when the client left type out, it is the
	// type vLLM infers from the part's keys.
	PartType string
	// URL is the source of an image_url, input_image, audio_url or video_url
	// part: a data:, http:, https: or file: URL, as sent.
	URL string
	// Data is the base64 payload of an input_audio part and Format its
	// declared container ("wav" or "mp3"). vLLM turns the pair into the
	// data URL "data:audio/<format>;base64,<data>".
	Data   string
	Format string
}

// InputAudioFormats are the input_audio formats omnipd takes: those of
// OpenAI's InputAudio type (Literal["wav", "mp3"], openai-python
// src/openai/types/chat/chat_completion_content_part_input_audio_param.py
// at f20a9a18), which are also the containers the reference engine decodes
// (reference/engine/audioproc). vLLM passes any format on to its audio loader.
func InputAudioFormats() []string { return slices.Clone(inputAudio) }

var inputAudio = []string{"wav", "mp3"}

// inputAudioFormats words the formats for messages: "wav or mp3".
var inputAudioFormats = strings.Join(inputAudio, " or ")

func isInputAudioFormat(f string) bool { return slices.Contains(inputAudio, f) }

// isTextPartType reports the non-media part types vLLM accepts; MediaItems
// skips them.
func isTextPartType(t string) bool {
	switch t {
	case "text", "input_text", "output_text", "refusal", "thinking", "tool_reference":
		return true
	}
	return false
}

// refusedPartReason is why a media part type vLLM accepts is not served by
// omnipd, or false if it is not such a type.
func refusedPartReason(t string) (string, bool) {
	switch t {
	case "image_embeds", "audio_embeds", "prompt_embeds":
		return "precomputed embeddings are not supported", true
	case "image_pil":
		return "PIL images can only be passed to vLLM in-process", true
	}
	return "", false
}

const supportedPartTypes = "text, image_url, input_image, audio_url, input_audio or video_url"

// MediaItems returns the media parts of req in message and part order, each
// with its source checked for shape but not fetched. Text parts are skipped.
//
// A malformed part, a part type vLLM does not know, and a media part type
// omnipd does not serve (image_embeds, ...) are *RequestError naming the part
// or its offending field. maxItemBytes bounds inline payloads (input_audio
// data and data: URLs): one whose encoded length implies more decoded bytes
// is refused, wrapping ErrMediaTooLarge, without being decoded. A
// maxItemBytes <= 0 means no bound.
func MediaItems(req *ChatCompletionRequest, maxItemBytes int64) ([]MediaItem, error) {
	if req == nil {
		return nil, nil
	}
	var items []MediaItem
	for i, m := range req.Messages {
		if m.Content == nil {
			continue
		}
		for j, p := range m.Content.Parts {
			path := fmt.Sprintf("messages[%d].content[%d]", i, j)
			item, isMedia, err := mediaPart(path, p, maxItemBytes)
			if err != nil {
				return nil, err
			}
			if isMedia {
				items = append(items, item)
			}
		}
	}
	return items, nil
}

// mediaPart reads one content part. It reports false for a text part.
func mediaPart(path string, p ContentPart, maxItemBytes int64) (MediaItem, bool, error) {
	typ := p.Type
	// Without a type, vLLM recognises a part by its first media key, in this
	// order, and accepts the bare-string form of the *_url keys.
	bare := typ == ""
	if bare {
		typ = inferPartType(p.Extra)
		if typ == "" {
			return MediaItem{}, false, &RequestError{Param: path + ".type", Message: "required; want " + supportedPartTypes}
		}
	}
	if isTextPartType(typ) {
		return MediaItem{}, false, nil
	}
	if why, ok := refusedPartReason(typ); ok {
		return MediaItem{}, false, &RequestError{Param: path + ".type", Message: fmt.Sprintf("content part type %q is not supported: %s", typ, why)}
	}
	item := MediaItem{Path: path, PartType: typ}
	var err error
	switch typ {
	case PartImageURL:
		item.Kind = MediaImage
		item.URL, err = imageURLField(path, p.Extra, bare)
	case PartAudioURL:
		item.Kind = MediaAudio
		item.URL, err = urlField(path, typ, p.Extra[typ], bare)
	case PartVideoURL:
		item.Kind = MediaVideo
		item.URL, err = urlField(path, typ, p.Extra[typ], bare)
	case PartInputImage:
		item.Kind = MediaImage
		item.URL, err = inputImageField(path, p.Extra)
	case PartInputAudio:
		item.Kind = MediaAudio
		item.Data, item.Format, err = inputAudioField(path+"."+PartInputAudio, p.Extra[PartInputAudio], maxItemBytes)
	default:
		return MediaItem{}, false, &RequestError{Param: path + ".type", Message: fmt.Sprintf("unsupported content part type %q; want %s", typ, supportedPartTypes)}
	}
	if err != nil {
		return MediaItem{}, false, err
	}
	if item.URL != "" {
		param := path + "." + typ
		if typ != PartInputImage && !(bare && kindOf(p.Extra[typ]) == "string") {
			param += ".url"
		}
		if err := checkMediaURL(param, item.URL, maxItemBytes); err != nil {
			return MediaItem{}, false, err
		}
	}
	return item, true, nil
}

// inferPartType is the type vLLM gives a part sent without one: the first of
// its recognised keys that is present ("" if none is). input_audio counts
// only when it is not null, as in vLLM.
func inferPartType(extra map[string]json.RawMessage) string {
	for _, key := range []string{"image_url", "image_pil", "image_embeds", "audio_embeds", "prompt_embeds", "audio_url", "input_audio", "video_url", "tool_reference"} {
		raw, ok := extra[key]
		if !ok || key == PartInputAudio && kindOf(raw) == "null" {
			continue
		}
		return key
	}
	return ""
}

// imageURLField reads image_url: {"url": ..., "detail": ...}. detail is one
// of OpenAI's values; vLLM ignores it, and so does omnipd.
func imageURLField(path string, extra map[string]json.RawMessage, bare bool) (string, error) {
	raw := extra[PartImageURL]
	u, err := urlField(path, PartImageURL, raw, bare)
	if err != nil || kindOf(raw) != "object" {
		return u, err
	}
	obj, _ := jsonObject(raw)
	if detail, ok := obj["detail"]; ok {
		param := path + ".image_url.detail"
		d, err := jsonString(param, detail)
		if err != nil {
			return "", err
		}
		if d != "auto" && d != "low" && d != "high" {
			return "", &RequestError{Param: param, Message: fmt.Sprintf("unsupported detail %q; want auto, low or high", d)}
		}
	}
	return u, nil
}

// urlField reads the URL of an image_url, audio_url or video_url part: an
// object {"url": "..."}, or, when the part had no type (bare), the string
// itself.
func urlField(path, key string, raw json.RawMessage, bare bool) (string, error) {
	param := path + "." + key
	switch kindOf(raw) {
	case "nothing":
		return "", &RequestError{Param: param, Message: fmt.Sprintf("required for a part of type %q", key)}
	case "string":
		if !bare {
			return "", &RequestError{Param: param, Message: `expected an object with a "url" string, got string`}
		}
		return nonEmptyString(param, raw)
	case "object":
		obj, err := jsonObject(raw)
		if err != nil {
			return "", &RequestError{Param: param, Message: err.Error(), Err: err}
		}
		u, ok := obj["url"]
		if !ok {
			return "", &RequestError{Param: param + ".url", Message: "required"}
		}
		return nonEmptyString(param+".url", u)
	default:
		return "", &RequestError{Param: param, Message: `expected an object with a "url" string, got ` + kindOf(raw)}
	}
}

// inputImageField reads the Responses-API image part vLLM also accepts in
// chat: {"type": "input_image", "image_url": "...", "detail": "auto"}.
func inputImageField(path string, extra map[string]json.RawMessage) (string, error) {
	detail, ok := extra["detail"]
	if !ok {
		return "", &RequestError{Param: path + ".detail", Message: `required for a part of type "input_image"; want auto, low or high`}
	}
	d, err := jsonString(path+".detail", detail)
	if err != nil {
		return "", err
	}
	if d != "auto" && d != "low" && d != "high" {
		return "", &RequestError{Param: path + ".detail", Message: fmt.Sprintf("unsupported detail %q; want auto, low or high", d)}
	}
	raw, ok := extra["image_url"]
	if !ok || kindOf(raw) == "null" {
		if _, byFile := extra["file_id"]; byFile {
			return "", &RequestError{Param: path + ".file_id", Message: "file_id is not supported; send image_url"}
		}
		return "", &RequestError{Param: path + ".image_url", Message: `required for a part of type "input_image"`}
	}
	return nonEmptyString(path+".image_url", raw)
}

// inputAudioField reads input_audio: {"data": "<base64>", "format": "wav"}.
func inputAudioField(param string, raw json.RawMessage, maxItemBytes int64) (data, format string, err error) {
	switch kindOf(raw) {
	case "object":
	case "nothing":
		return "", "", &RequestError{Param: param, Message: `required for a part of type "input_audio"`}
	default:
		return "", "", &RequestError{Param: param, Message: `expected an object with "data" and "format", got ` + kindOf(raw)}
	}
	obj, err := jsonObject(raw)
	if err != nil {
		return "", "", &RequestError{Param: param, Message: err.Error(), Err: err}
	}
	f, ok := obj["format"]
	if !ok {
		return "", "", &RequestError{Param: param + ".format", Message: "required; want " + inputAudioFormats}
	}
	if format, err = jsonString(param+".format", f); err != nil {
		return "", "", err
	}
	if !isInputAudioFormat(format) {
		return "", "", &RequestError{Param: param + ".format", Message: fmt.Sprintf("unsupported format %q; want %s", format, inputAudioFormats)}
	}
	d, ok := obj["data"]
	if !ok {
		return "", "", &RequestError{Param: param + ".data", Message: "required"}
	}
	if data, err = nonEmptyString(param+".data", d); err != nil {
		return "", "", err
	}
	if n := Base64DecodedLen(data); maxItemBytes > 0 && n > maxItemBytes {
		return "", "", tooLargeMedia(param+".data", n, maxItemBytes)
	}
	return data, format, nil
}

// checkMediaURL checks a media URL's scheme the way vLLM's media connector
// dispatches on it, and bounds a data URL's payload.
func checkMediaURL(param, u string, maxItemBytes int64) error {
	if hasDataScheme(u) {
		d, err := ParseDataURL(u)
		if err != nil {
			return &RequestError{Param: param, Message: err.Error(), Err: err}
		}
		if n := d.DecodedLen(); maxItemBytes > 0 && n > maxItemBytes {
			return tooLargeMedia(param, n, maxItemBytes)
		}
		return nil
	}
	parsed, err := url.Parse(u)
	if err != nil {
		return &RequestError{Param: param, Message: "invalid URL: " + err.Error(), Err: err}
	}
	switch strings.ToLower(parsed.Scheme) {
	case "http", "https":
		if parsed.Host == "" {
			return &RequestError{Param: param, Message: "invalid URL: no host"}
		}
	case "file":
	default:
		return &RequestError{Param: param, Message: "the URL must be a data, http(s) or file URL"}
	}
	return nil
}

func tooLargeMedia(param string, n, limit int64) error {
	return &RequestError{
		Param:   param,
		Message: fmt.Sprintf("media item of %d bytes exceeds the limit of %d bytes", n, limit),
		Err:     ErrMediaTooLarge,
	}
}

// DataURL is an RFC 2397 data URL split into its parts:
// data:[<mediatype>][;<param>=<value>]*[;base64],<data>.
type DataURL struct {
	// MediaType is the type and subtype, lower-cased and without parameters;
	// empty when the URL names none.
	MediaType string
	// Base64 reports the ";base64" marker; without it Data is
	// percent-encoded.
	Base64 bool
	// Data is the payload after the first comma, still encoded.
	Data string
}

// hasDataScheme reports whether u starts with "data:", in any case, which is
// how vLLM recognises a data URL.
func hasDataScheme(u string) bool { return len(u) >= 5 && strings.EqualFold(u[:5], "data:") }

// ParseDataURL splits a data URL without decoding its payload, so a caller
// can bound the payload first (see DecodedLen).
func ParseDataURL(u string) (DataURL, error) {
	if !hasDataScheme(u) {
		return DataURL{}, errors.New("not a data URL")
	}
	header, data, ok := strings.Cut(u[5:], ",")
	if !ok {
		return DataURL{}, errors.New("invalid data URL: missing ',' separator")
	}
	params := strings.Split(header, ";")
	d := DataURL{MediaType: strings.ToLower(strings.TrimSpace(params[0])), Data: data}
	if n := len(params); n > 1 && strings.EqualFold(strings.TrimSpace(params[n-1]), "base64") {
		d.Base64 = true
	}
	if d.MediaType != "" && !strings.Contains(d.MediaType, "/") {
		return DataURL{}, fmt.Errorf("invalid data URL: media type %q is not type/subtype", d.MediaType)
	}
	return d, nil
}

// DecodedLen is the number of bytes the payload decodes to, computed from its
// length alone: exact for well-formed base64 and percent-encoding.
func (d DataURL) DecodedLen() int64 {
	if d.Base64 {
		return Base64DecodedLen(d.Data)
	}
	return int64(len(d.Data)) - 2*int64(strings.Count(d.Data, "%"))
}

// Base64DecodedLen is the number of bytes standard base64 s decodes to,
// from its length and padding alone. Line breaks are not counted, as Go's
// decoder skips them.
func Base64DecodedLen(s string) int64 {
	n := int64(len(s)) - int64(strings.Count(s, "\n")) - int64(strings.Count(s, "\r"))
	full := n / 4 * 3
	if rem := n % 4; rem > 1 {
		full += rem - 1
	}
	trimmed := strings.TrimRight(s, "\r\n")
	if n%4 == 0 {
		switch {
		case strings.HasSuffix(trimmed, "=="):
			full -= 2
		case strings.HasSuffix(trimmed, "="):
			full--
		}
	}
	return max(full, 0)
}

// MMProcessorKwargsKey is the top-level chat request key under which vLLM
// takes per-request keyword arguments for the model's HF processor.
const MMProcessorKwargsKey = "mm_processor_kwargs"

// MMProcessorKwargs is a chat request's mm_processor_kwargs.
type MMProcessorKwargs struct {
	// UseAudioInVideo makes vLLM also load the audio track of every
	// video_url part, as one more audio item (Qwen-Omni models).
	UseAudioInVideo bool
	// Extra holds the other keys verbatim; they are the model processor's
	// business.
	Extra map[string]json.RawMessage
}

// ParseMMProcessorKwargs reads mm_processor_kwargs from the request's Extra.
// Absent and null give the zero value. A value that is not an object, and a
// use_audio_in_video that is not a boolean, are *RequestError.
func ParseMMProcessorKwargs(req *ChatCompletionRequest) (MMProcessorKwargs, error) {
	var kw MMProcessorKwargs
	if req == nil {
		return kw, nil
	}
	raw, ok := req.Extra[MMProcessorKwargsKey]
	if !ok || kindOf(raw) == "null" {
		return kw, nil
	}
	if kindOf(raw) != "object" {
		return kw, &RequestError{Param: MMProcessorKwargsKey, Message: "expected an object, got " + kindOf(raw)}
	}
	obj, err := jsonObject(raw)
	if err != nil {
		return kw, &RequestError{Param: MMProcessorKwargsKey, Message: err.Error(), Err: err}
	}
	for k, v := range obj {
		if k != "use_audio_in_video" {
			if kw.Extra == nil {
				kw.Extra = map[string]json.RawMessage{}
			}
			kw.Extra[k] = v
			continue
		}
		switch kindOf(v) {
		case "boolean":
			kw.UseAudioInVideo = bytes.HasPrefix(bytes.TrimSpace(v), []byte("true"))
		case "null":
		default:
			return MMProcessorKwargs{}, &RequestError{Param: MMProcessorKwargsKey + ".use_audio_in_video", Message: "expected a boolean, got " + kindOf(v)}
		}
	}
	return kw, nil
}

// DefaultMediaLimit is vLLM's per-prompt limit for a modality that
// --limit-mm-per-prompt does not name.
const DefaultMediaLimit = 999

// MediaLimits is the maximum number of items per prompt for each modality,
// parsed from a --limit-mm-per-prompt value. A modality it does not name
// (and the nil MediaLimits) allows DefaultMediaLimit.
type MediaLimits map[MediaKind]int

// Max is the limit for kind.
func (l MediaLimits) Max(kind MediaKind) int {
	if n, ok := l[kind]; ok {
		return n
	}
	return DefaultMediaLimit
}

// ParseMediaLimits parses a --limit-mm-per-prompt value as vLLM takes it: a
// JSON object keyed by modality whose values are counts ({"image": 2,
// "audio": 1}) or, in the newer form, objects with a count and profiling
// options ({"video": {"count": 1, "num_frames": 32}}); the two mix. An object
// without count allows DefaultMediaLimit. The profiling options are checked
// as vLLM checks them (positive integers; for image, audio and video only
// the options vLLM defines) and then dropped: they shape vLLM's memory
// profiling, not what a request may carry. An empty value names no limits.
func ParseMediaLimits(s string) (MediaLimits, error) {
	if strings.TrimSpace(s) == "" {
		return MediaLimits{}, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &obj); err != nil || obj == nil {
		return nil, fmt.Errorf("limit-mm-per-prompt %q: want a JSON object such as {\"image\": 2, \"audio\": 1}", s)
	}
	limits := make(MediaLimits, len(obj))
	// Sorted, so that of several bad entries the same one is reported.
	for _, modality := range slices.Sorted(maps.Keys(obj)) {
		n, err := parseModalityLimit(MediaKind(modality), obj[modality])
		if err != nil {
			return nil, fmt.Errorf("limit-mm-per-prompt %s: %w", modality, err)
		}
		limits[MediaKind(modality)] = n
	}
	return limits, nil
}

// profilingOptions are the options vLLM's MultiModalConfig allows beside
// count for each modality (ImageDummyOptions, AudioDummyOptions,
// VideoDummyOptions, which forbid other keys). Other modalities take count
// only and ignore the rest.
func profilingOptions(kind MediaKind) (opts []string, strict bool) {
	switch kind {
	case MediaImage:
		return []string{"width", "height"}, true
	case MediaAudio:
		return []string{"length"}, true
	case MediaVideo:
		return []string{"num_frames", "width", "height"}, true
	default:
		return nil, false
	}
}

func parseModalityLimit(kind MediaKind, raw json.RawMessage) (int, error) {
	switch kindOf(raw) {
	case "number":
		return jsonInt(raw, 0, "count")
	case "object":
	default:
		return 0, fmt.Errorf("want a count or an object with a count, got %s", kindOf(raw))
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return 0, err
	}
	count := DefaultMediaLimit
	opts, strict := profilingOptions(kind)
	for _, key := range slices.Sorted(maps.Keys(obj)) {
		v := obj[key]
		switch {
		case key == "count":
			n, err := jsonInt(v, 0, "count")
			if err != nil {
				return 0, err
			}
			count = n
		case slices.Contains(opts, key):
			if kindOf(v) == "null" {
				continue
			}
			if _, err := jsonInt(v, 1, key); err != nil {
				return 0, err
			}
		case strict:
			return 0, fmt.Errorf("unknown option %q; want count or %s", key, strings.Join(opts, ", "))
		}
	}
	return count, nil
}

// jsonInt reads an integer of at least least.
func jsonInt(raw json.RawMessage, least int, name string) (int, error) {
	n, err := strconv.Atoi(string(bytes.TrimSpace(raw)))
	if err != nil || n < least {
		return 0, fmt.Errorf("%s must be an integer >= %d, got %s", name, least, bytes.TrimSpace(raw))
	}
	return n, nil
}

// Check counts items per modality in order and returns a *RequestError
// naming the first part over its limit, worded as vLLM words it. With
// useAudioInVideo, each video part also counts as one audio item, as vLLM
// adds the video's audio track as an audio item; the error then names the
// video part.
func (l MediaLimits) Check(items []MediaItem, useAudioInVideo bool) error {
	counts := map[MediaKind]int{}
	add := func(item MediaItem, kind MediaKind) error {
		counts[kind]++
		if limit := l.Max(kind); counts[kind] > limit {
			return &RequestError{
				Param:   item.Path,
				Message: fmt.Sprintf("At most %d %s(s) may be provided in one prompt.", limit, kind),
			}
		}
		return nil
	}
	for _, item := range items {
		if err := add(item, item.Kind); err != nil {
			return err
		}
		if useAudioInVideo && item.Kind == MediaVideo {
			if err := add(item, MediaAudio); err != nil {
				return err
			}
		}
	}
	return nil
}

// jsonObject decodes a JSON object into its members, verbatim.
func jsonObject(raw json.RawMessage) (map[string]json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, err
	}
	return obj, nil
}

// jsonString decodes a string, naming param when raw is something else.
func jsonString(param string, raw json.RawMessage) (string, error) {
	if kindOf(raw) != "string" {
		return "", &RequestError{Param: param, Message: "expected a string, got " + kindOf(raw)}
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", &RequestError{Param: param, Message: err.Error(), Err: err}
	}
	return s, nil
}

func nonEmptyString(param string, raw json.RawMessage) (string, error) {
	s, err := jsonString(param, raw)
	if err == nil && s == "" {
		return "", &RequestError{Param: param, Message: "must not be empty"}
	}
	return s, err
}
