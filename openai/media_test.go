package openai

import (
	"encoding/base64"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// chatWithParts is a chat request whose first user message has parts, the
// JSON elements of its content array.
func chatWithParts(t *testing.T, parts ...string) *ChatCompletionRequest {
	t.Helper()
	return decodeChat(t, `{"model":"m","messages":[{"role":"system","content":"be brief"},`+
		`{"role":"user","content":[`+strings.Join(parts, ",")+`]}]}`)
}

func TestMediaItemsAccepted(t *testing.T) {
	wav := base64.StdEncoding.EncodeToString([]byte("RIFF0000WAVE"))
	tests := []struct {
		name string
		part string
		want MediaItem
	}{
		{"image_url", `{"type":"image_url","image_url":{"url":"https://x.test/a.png"}}`,
			MediaItem{Kind: MediaImage, PartType: PartImageURL, URL: "https://x.test/a.png"}},
		{"image_url with detail", `{"type":"image_url","image_url":{"url":"https://x.test/a.png","detail":"low"}}`,
			MediaItem{Kind: MediaImage, PartType: PartImageURL, URL: "https://x.test/a.png"}},
		{"image data URL", `{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw=="}}`,
			MediaItem{Kind: MediaImage, PartType: PartImageURL, URL: "data:image/png;base64,iVBORw=="}},
		{"input_image", `{"type":"input_image","image_url":"file:///media/a.jpg","detail":"auto"}`,
			MediaItem{Kind: MediaImage, PartType: PartInputImage, URL: "file:///media/a.jpg"}},
		{"audio_url", `{"type":"audio_url","audio_url":{"url":"http://x.test/a.mp3"}}`,
			MediaItem{Kind: MediaAudio, PartType: PartAudioURL, URL: "http://x.test/a.mp3"}},
		{"input_audio", `{"type":"input_audio","input_audio":{"data":"` + wav + `","format":"wav"}}`,
			MediaItem{Kind: MediaAudio, PartType: PartInputAudio, Data: wav, Format: "wav"}},
		{"video_url", `{"type":"video_url","video_url":{"url":"https://x.test/v.mp4"}}`,
			MediaItem{Kind: MediaVideo, PartType: PartVideoURL, URL: "https://x.test/v.mp4"}},
		// vLLM recognises a part without type by its key, and then takes
		// the bare-string form of the *_url keys too.
		{"untyped image_url string", `{"image_url":"https://x.test/a.png"}`,
			MediaItem{Kind: MediaImage, PartType: PartImageURL, URL: "https://x.test/a.png"}},
		{"untyped video_url object", `{"video_url":{"url":"https://x.test/v.mp4"}}`,
			MediaItem{Kind: MediaVideo, PartType: PartVideoURL, URL: "https://x.test/v.mp4"}},
		{"untyped input_audio", `{"input_audio":{"data":"` + wav + `","format":"mp3"}}`,
			MediaItem{Kind: MediaAudio, PartType: PartInputAudio, Data: wav, Format: "mp3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := chatWithParts(t, `{"type":"text","text":"look"}`, tt.part)
			items, err := MediaItems(req, 1<<20)
			if err != nil {
				t.Fatalf("MediaItems: %v", err)
			}
			want := tt.want
			want.Path = "messages[1].content[1]"
			if !reflect.DeepEqual(items, []MediaItem{want}) {
				t.Errorf("items = %#v\nwant %#v", items, []MediaItem{want})
			}
		})
	}
}

func TestMediaItemsOrderAndSkips(t *testing.T) {
	req := decodeChat(t, `{"model":"m","messages":[
		{"role":"user","content":[{"type":"video_url","video_url":{"url":"https://x.test/v.mp4"}},{"type":"text","text":"a"}]},
		{"role":"assistant","content":"plain string content"},
		{"role":"assistant","content":null},
		{"role":"user","content":[{"type":"refusal","refusal":"no"},{"type":"thinking","thinking":"hm"},{"type":"image_url","image_url":{"url":"https://x.test/i.png"}}]}]}`)
	items, err := MediaItems(req, 0)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, it := range items {
		paths = append(paths, it.Path+"="+string(it.Kind))
	}
	want := []string{"messages[0].content[0]=video", "messages[3].content[2]=image"}
	if !reflect.DeepEqual(paths, want) {
		t.Errorf("items = %v, want %v", paths, want)
	}
}

func TestMediaItemsMalformed(t *testing.T) {
	const at = "messages[1].content[0]"
	tests := []struct {
		name      string
		part      string
		wantParam string
		wantMsg   string
	}{
		{"unknown type", `{"type":"file","file":{}}`, at + ".type", "unsupported content part type"},
		{"no type, no media key", `{"text":"hi"}`, at + ".type", "required"},
		{"image_embeds refused", `{"type":"image_embeds","image_embeds":"AAAA"}`, at + ".type", "embeddings are not supported"},
		{"untyped audio_embeds refused", `{"audio_embeds":"AAAA"}`, at + ".type", "embeddings are not supported"},
		{"prompt_embeds refused", `{"type":"prompt_embeds","data":"AAAA"}`, at + ".type", "not supported"},
		{"image_url missing", `{"type":"image_url"}`, at + ".image_url", "required"},
		{"image_url string with type", `{"type":"image_url","image_url":"https://x.test/a.png"}`, at + ".image_url", "expected an object"},
		{"image_url number", `{"type":"image_url","image_url":3}`, at + ".image_url", "got number"},
		{"image_url.url missing", `{"type":"image_url","image_url":{}}`, at + ".image_url.url", "required"},
		{"image_url.url number", `{"type":"image_url","image_url":{"url":1}}`, at + ".image_url.url", "expected a string"},
		{"image_url.url empty", `{"type":"image_url","image_url":{"url":""}}`, at + ".image_url.url", "must not be empty"},
		{"image_url.detail bad", `{"type":"image_url","image_url":{"url":"https://x.test/a","detail":"max"}}`, at + ".image_url.detail", "unsupported detail"},
		{"unsupported scheme", `{"type":"image_url","image_url":{"url":"ftp://x.test/a.png"}}`, at + ".image_url.url", "data, http(s) or file"},
		{"http without host", `{"type":"audio_url","audio_url":{"url":"http:///a.mp3"}}`, at + ".audio_url.url", "no host"},
		{"bare string bad scheme", `{"video_url":"gopher://x.test/v"}`, at + ".video_url", "data, http(s) or file"},
		{"data URL without comma", `{"type":"video_url","video_url":{"url":"data:video/mp4;base64"}}`, at + ".video_url.url", "missing ','"},
		{"input_image without detail", `{"type":"input_image","image_url":"https://x.test/a.png"}`, at + ".detail", "required"},
		{"input_image file_id", `{"type":"input_image","file_id":"file-1","detail":"auto"}`, at + ".file_id", "not supported"},
		{"input_audio missing", `{"type":"input_audio"}`, at + ".input_audio", "required"},
		{"input_audio string", `{"type":"input_audio","input_audio":"AAAA"}`, at + ".input_audio", "expected an object"},
		{"input_audio format missing", `{"type":"input_audio","input_audio":{"data":"AAAA"}}`, at + ".input_audio.format", "required"},
		{"input_audio format flac", `{"type":"input_audio","input_audio":{"data":"AAAA","format":"flac"}}`, at + ".input_audio.format", `unsupported format "flac"`},
		{"input_audio format number", `{"type":"input_audio","input_audio":{"data":"AAAA","format":1}}`, at + ".input_audio.format", "expected a string"},
		{"input_audio data missing", `{"type":"input_audio","input_audio":{"format":"wav"}}`, at + ".input_audio.data", "required"},
		{"input_audio data empty", `{"type":"input_audio","input_audio":{"data":"","format":"wav"}}`, at + ".input_audio.data", "must not be empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := MediaItems(chatWithParts(t, tt.part), 1<<20)
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("err = %v, want a *RequestError", err)
			}
			if re.Param != tt.wantParam {
				t.Errorf("Param = %q, want %q (%v)", re.Param, tt.wantParam, err)
			}
			if !strings.Contains(re.Message, tt.wantMsg) {
				t.Errorf("Message = %q, want it to contain %q", re.Message, tt.wantMsg)
			}
			if errors.Is(err, ErrMediaTooLarge) {
				t.Errorf("a malformed part must not read as too large")
			}
		})
	}
}

func TestMediaItemsPayloadBound(t *testing.T) {
	const limit = 12
	fits := base64.StdEncoding.EncodeToString(make([]byte, limit))
	over := base64.StdEncoding.EncodeToString(make([]byte, limit+1))
	tests := []struct {
		name      string
		part      string
		wantParam string // "" when the part fits
	}{
		{"input_audio fits", `{"type":"input_audio","input_audio":{"data":"` + fits + `","format":"wav"}}`, ""},
		{"input_audio over", `{"type":"input_audio","input_audio":{"data":"` + over + `","format":"wav"}}`, "messages[1].content[0].input_audio.data"},
		{"data URL fits", `{"type":"image_url","image_url":{"url":"data:image/png;base64,` + fits + `"}}`, ""},
		{"data URL over", `{"type":"image_url","image_url":{"url":"data:image/png;base64,` + over + `"}}`, "messages[1].content[0].image_url.url"},
		{"bare data URL over", `{"audio_url":"data:audio/wav;base64,` + over + `"}`, "messages[1].content[0].audio_url"},
		{"percent data URL over", `{"type":"image_url","image_url":{"url":"data:image/svg+xml,` + strings.Repeat("%41", limit+1) + `"}}`, "messages[1].content[0].image_url.url"},
		{"percent data URL fits", `{"type":"image_url","image_url":{"url":"data:image/svg+xml,` + strings.Repeat("%41", limit) + `"}}`, ""},
		// Not valid base64 at all: still bounded by its length alone, which
		// shows the payload is never decoded here.
		{"undecodable over", `{"type":"input_audio","input_audio":{"data":"` + strings.Repeat("!", 40) + `","format":"wav"}}`, "messages[1].content[0].input_audio.data"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			items, err := MediaItems(chatWithParts(t, tt.part), limit)
			if tt.wantParam == "" {
				if err != nil || len(items) != 1 {
					t.Fatalf("items = %v, err = %v; want one item", items, err)
				}
				return
			}
			var re *RequestError
			if !errors.As(err, &re) || !errors.Is(err, ErrMediaTooLarge) {
				t.Fatalf("err = %v, want a RequestError wrapping ErrMediaTooLarge", err)
			}
			if re.Param != tt.wantParam {
				t.Errorf("Param = %q, want %q", re.Param, tt.wantParam)
			}
		})
	}
}

func TestBase64DecodedLen(t *testing.T) {
	for n := range 10 {
		payload := strings.Repeat("x", n)
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding} {
			s := enc.EncodeToString([]byte(payload))
			if got := Base64DecodedLen(s); got != int64(n) {
				t.Errorf("Base64DecodedLen(%q) = %d, want %d", s, got, n)
			}
		}
	}
	if got := Base64DecodedLen("QUJD\nREVG\r\n"); got != 6 {
		t.Errorf("with line breaks: got %d, want 6", got)
	}
}

func TestParseDataURL(t *testing.T) {
	tests := []struct {
		in      string
		want    DataURL
		wantErr bool
	}{
		{"data:image/png;base64,AAAA", DataURL{MediaType: "image/png", Base64: true, Data: "AAAA"}, false},
		{"DATA:Audio/WAV;rate=16000;BASE64,AA,BB", DataURL{MediaType: "audio/wav", Base64: true, Data: "AA,BB"}, false},
		{"data:text/plain;charset=utf-8,a%20b", DataURL{MediaType: "text/plain", Data: "a%20b"}, false},
		{"data:,x", DataURL{Data: "x"}, false},
		{"data:image/png;base64", DataURL{}, true},
		{"data:png;base64,AAAA", DataURL{}, true},
		{"https://x.test/a", DataURL{}, true},
	}
	for _, tt := range tests {
		got, err := ParseDataURL(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseDataURL(%q) = %+v, %v; want %+v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseMMProcessorKwargs(t *testing.T) {
	tests := []struct {
		name      string
		extra     string // the mm_processor_kwargs member, or "" for none
		want      bool
		wantExtra []string
		wantParam string
	}{
		{"absent", ``, false, nil, ""},
		{"null", `,"mm_processor_kwargs":null`, false, nil, ""},
		{"true", `,"mm_processor_kwargs":{"use_audio_in_video":true}`, true, nil, ""},
		{"false with others", `,"mm_processor_kwargs":{"use_audio_in_video":false,"fps":2,"max_pixels":1024}`, false, []string{"fps", "max_pixels"}, ""},
		{"not an object", `,"mm_processor_kwargs":[1]`, false, nil, "mm_processor_kwargs"},
		{"string flag", `,"mm_processor_kwargs":{"use_audio_in_video":"true"}`, false, nil, "mm_processor_kwargs.use_audio_in_video"},
		{"number flag", `,"mm_processor_kwargs":{"use_audio_in_video":1}`, false, nil, "mm_processor_kwargs.use_audio_in_video"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := decodeChat(t, `{"model":"m","messages":[{"role":"user","content":"hi"}]`+tt.extra+`}`)
			kw, err := ParseMMProcessorKwargs(req)
			if tt.wantParam != "" {
				var re *RequestError
				if !errors.As(err, &re) || re.Param != tt.wantParam {
					t.Fatalf("err = %v, want a RequestError at %q", err, tt.wantParam)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if kw.UseAudioInVideo != tt.want {
				t.Errorf("UseAudioInVideo = %v, want %v", kw.UseAudioInVideo, tt.want)
			}
			var keys []string
			for k := range kw.Extra {
				keys = append(keys, k)
			}
			if len(keys) != len(tt.wantExtra) {
				t.Errorf("Extra keys = %v, want %v", keys, tt.wantExtra)
			}
			for _, k := range tt.wantExtra {
				if _, ok := kw.Extra[k]; !ok {
					t.Errorf("Extra lacks %q", k)
				}
			}
		})
	}
}

func TestParseMediaLimits(t *testing.T) {
	tests := []struct {
		in      string
		want    MediaLimits
		wantErr string
	}{
		{``, MediaLimits{}, ""},
		{`{"image": 2, "audio": 1}`, MediaLimits{MediaImage: 2, MediaAudio: 1}, ""},
		{`{"image": 0, "video": 0}`, MediaLimits{MediaImage: 0, MediaVideo: 0}, ""},
		{`{"video": {"count": 1, "num_frames": 32, "width": 512, "height": 512}, "image": {"count": 5, "width": 512}}`,
			MediaLimits{MediaVideo: 1, MediaImage: 5}, ""},
		{`{"image": 16, "audio": {"count": 2, "length": 16000}}`, MediaLimits{MediaImage: 16, MediaAudio: 2}, ""},
		{`{"video": {"num_frames": 8}}`, MediaLimits{MediaVideo: DefaultMediaLimit}, ""},
		{`{"vision_chunk": {"count": 3, "anything": 1}}`, MediaLimits{"vision_chunk": 3}, ""},
		{`image=2,video=1`, nil, "want a JSON object"},
		{`[1]`, nil, "want a JSON object"},
		{`null`, nil, "want a JSON object"},
		{`{"image": -1}`, nil, "image: count must be an integer >= 0"},
		{`{"image": 1.5}`, nil, "image: count must be an integer"},
		{`{"image": "2"}`, nil, "image: want a count"},
		{`{"video": {"count": 1, "fps": 2}}`, nil, `video: unknown option "fps"`},
		{`{"image": {"width": 0}}`, nil, "image: width must be an integer >= 1"},
		{`{"audio": {"count": -2}}`, nil, "audio: count must be an integer >= 0"},
	}
	for _, tt := range tests {
		got, err := ParseMediaLimits(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseMediaLimits(%s) error = %v, want it to contain %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseMediaLimits(%s) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	if got := (MediaLimits(nil)).Max(MediaAudio); got != DefaultMediaLimit {
		t.Errorf("nil limits Max = %d, want %d", got, DefaultMediaLimit)
	}
}

func TestMediaLimitsCheck(t *testing.T) {
	part := func(j int, kind MediaKind) MediaItem {
		return MediaItem{Path: "messages[0].content[" + strconv.Itoa(j) + "]", Kind: kind}
	}
	img := func(j int) MediaItem { return part(j, MediaImage) }
	aud := func(j int) MediaItem { return part(j, MediaAudio) }
	vid := func(j int) MediaItem { return part(j, MediaVideo) }
	tests := []struct {
		name            string
		limits          string
		items           []MediaItem
		useAudioInVideo bool
		wantParam       string // "" for no error
		wantMsg         string
	}{
		{"within", `{"image": 2, "audio": 1}`, []MediaItem{img(0), aud(1), img(2)}, false, "", ""},
		{"third image", `{"image": 2}`, []MediaItem{img(0), aud(1), img(2), img(3), img(4)}, false,
			"messages[0].content[3]", "At most 2 image(s) may be provided in one prompt."},
		{"zero video", `{"video": 0}`, []MediaItem{img(0), vid(1)}, false,
			"messages[0].content[1]", "At most 0 video(s)"},
		{"unnamed kinds default to 999", `{"image": 1}`, []MediaItem{aud(0), aud(1), vid(2), vid(3)}, false, "", ""},
		{"audio in video counts", `{"audio": 1, "video": 2}`, []MediaItem{aud(0), vid(1)}, true,
			"messages[0].content[1]", "At most 1 audio(s)"},
		{"audio in video off", `{"audio": 1, "video": 2}`, []MediaItem{aud(0), vid(1)}, false, "", ""},
		{"audio in video within", `{"audio": 2, "video": 2}`, []MediaItem{aud(0), vid(1)}, true, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			limits, err := ParseMediaLimits(tt.limits)
			if err != nil {
				t.Fatal(err)
			}
			err = limits.Check(tt.items, tt.useAudioInVideo)
			if tt.wantParam == "" {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("err = %v, want a *RequestError", err)
			}
			if re.Param != tt.wantParam || !strings.Contains(re.Message, tt.wantMsg) {
				t.Errorf("got %q: %q; want %q: %q", re.Param, re.Message, tt.wantParam, tt.wantMsg)
			}
		})
	}
}
