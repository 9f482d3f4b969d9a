package worker

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnipd/omnipd/reference/engine"
	"github.com/omnipd/omnipd/reference/mediafetch"
)

// internalWords are what a client must never read about its media: the
// names of the packages a media part passes through, the prefixes of Go's
// own decoders and the wording of Go's errors.
var internalWords = regexp.MustCompile(`\b(audioproc|visionproc|mmproc|mediafetch|eccache|encoder|engine|tokenizer|worker|openai|stageconn)\b` +
	`|\b(png|jpeg|gif|mp3|wav|base64|http|net|url|os|io):|EOF|lstat|dial tcp|context deadline|illegal base64|no such file|%!|<nil>|Get "|127\.0\.0\.1`)

// Every way a media part can be refused — a bad WAV or MP3, a bad PNG,
// JPEG or GIF, a bad AVI, too large, too long, a source the policy
// refuses, a fetch that fails — answers a 400 with OpenAI's error body
// whose param is the part and whose message names the part's media field
// and says what is wrong in the client's terms, with no internal package
// name or Go error wording; the worker's log keeps the cause in full.
func TestMediaErrorsSpeakToTheClient(t *testing.T) {
	eng := runTestEngine(t, engine.Config{})
	local := t.TempDir()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/redirect.png":
			http.Redirect(w, r, "/cat.png", http.StatusFound)
		case "/hang.png":
			<-r.Context().Done()
		case "/big.png":
			w.Header().Set("Content-Length", fmt.Sprint(2<<20))
			_, _ = w.Write(make([]byte, 2<<20))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(upstream.Close)
	_, port, _ := strings.Cut(strings.TrimPrefix(upstream.URL, "http://"), ":")

	logs := &lockedLog{}
	serve := func(p mediafetch.Policy) string {
		srv, err := New(Config{Engine: eng, Logger: slog.New(slog.NewJSONHandler(logs, nil)), Media: MediaConfig{Policy: p}})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(srv)
		t.Cleanup(func() { hs.Close(); srv.Close() })
		return hs.URL
	}
	// open fetches from anywhere, loopback included, and reads local
	// files; its fetch timeout is short because one upstream never
	// answers (the outcome does not depend on it, only the wait does).
	open := serve(mediafetch.Policy{AllowAnyDomain: true, AllowPrivateNetworks: true, AllowedLocalPath: local, MaxBytes: 1 << 20, ImageTimeout: 200 * time.Millisecond})
	strict := serve(mediafetch.Policy{AllowedDomains: []string{"localhost"}})
	inline := serve(mediafetch.Policy{})

	avi, err := os.ReadFile("../engine/visionproc/testdata/mjpeg_pcm_64x48_8f.avi")
	if err != nil {
		t.Fatal(err)
	}
	mp4, err := os.ReadFile("../engine/visionproc/testdata/mjpeg_32x32_2f.mp4")
	if err != nil {
		t.Fatal(err)
	}
	var jpg, gifb bytes.Buffer
	if err := jpeg.Encode(&jpg, patterned(16, 16), nil); err != nil {
		t.Fatal(err)
	}
	if err := gif.Encode(&gifb, patterned(16, 16), nil); err != nil {
		t.Fatal(err)
	}
	adpcm := wavBytes(0.1)
	binary.LittleEndian.PutUint16(adpcm[20:], 2) // the fmt chunk's format tag

	audio := func(data []byte, format string) string {
		return fmt.Sprintf(`{"type":"input_audio","input_audio":{"data":%q,"format":%q}}`, b64(data), format)
	}
	url := func(typ, u string) string { return fmt.Sprintf(`{"type":%q,%q:{"url":%q}}`, typ, typ, u) }
	dataURL := func(typ, mediaType string, b []byte) string {
		return url(typ, "data:"+mediaType+";base64,"+b64(b))
	}

	cases := []struct {
		name, server, part string
		// field is the media field the message opens with; want is what
		// it must say; cause, when set, is what the log must keep.
		field, want, cause string
		extra              string
	}{
		{"bytes that are no WAV", open, audio([]byte("hello, world"), "wav"), ".input_audio", "not a WAV file: no RIFF/WAVE header", "", ""},
		{"a WAV cut short", open, audio(wavBytes(0.1)[:60], "wav"), ".input_audio", "not a valid WAV file: its \"data\" chunk declares 3200 bytes but 16 follow (is the file cut short?)", "", ""},
		{"a compressed WAV", open, audio(adpcm, "wav"), ".input_audio", "format tag 0x0002 (compressed or unknown) are not supported; send PCM or float WAV", "", ""},
		{"a WAV declared MP3", open, audio(wavBytes(0.1), "mp3"), ".input_audio", "declared MP3, but the data is WAV", "", ""},
		{"bytes that are no MP3", open, audio([]byte("no frame sync in here at all"), "mp3"), ".input_audio", "not an MP3 file: no MPEG audio frame found", "", ""},
		{"bad base64", open, `{"type":"input_audio","input_audio":{"data":"@@@@","format":"wav"}}`, ".input_audio", "the data is not valid base64 (at byte 0)", "illegal base64 data", ""},
		{"audio too long", open, audio(longWAV(301), "wav"), ".input_audio", "the audio lasts 301 s, over the limit of 300 s", "", ""},
		{"empty audio", open, audio(wavBytes(0), "wav"), ".input_audio", "the audio is empty", "", ""},
		{"an audio_url of no audio", open, dataURL("audio_url", "audio/ogg", []byte("OggS\x00\x02 not decodable")), ".audio_url", "not audio of a supported format; send WAV or MP3", "", ""},

		{"a PNG cut short", open, dataURL("image_url", "image/png", []byte("\x89PNG\r\n\x1a\nbroken")), ".image_url", "not a valid PNG image: it is cut short", "unexpected EOF", ""},
		{"a PNG of no pixels", open, dataURL("image_url", "image/png", pngBytes(64, 64)[:70]), ".image_url", "not a valid PNG image", "not enough pixel data", ""},
		{"a decompression bomb", open, dataURL("image_url", "image/png", pngOfSize(100000, 100000)), ".image_url", "the PNG image is 100000×100000, over the limit of 16384×16384 and 50000000 pixels", "", ""},
		{"a JPEG cut short", open, dataURL("image_url", "image/jpeg", jpg.Bytes()[:40]), ".image_url", "not a valid JPEG image: it is cut short", "unexpected EOF", ""},
		{"a GIF cut short", open, dataURL("image_url", "image/gif", gifb.Bytes()[:20]), ".image_url", "not a valid GIF image", "unexpected EOF", ""},
		{"WebP", open, dataURL("image_url", "image/webp", []byte("RIFF\x10\x00\x00\x00WEBPVP8 \x00\x00\x00\x00")), ".image_url", "WebP images are not supported; send PNG, JPEG or GIF", "", ""},
		{"an aspect ratio past 200", open, dataURL("image_url", "image/png", pngBytes(1, 400)), ".image_url", "its size 1×400 has an aspect ratio of 400.0, over the limit of 200", "", ""},
		{"audio in an image part", open, dataURL("image_url", "audio/wav", wavBytes(0.1)), ".image_url", `the data: URL's media type is "audio/wav"; this part takes image/*`, "", ""},

		{"an MP4", open, dataURL("video_url", "video/mp4", mp4), ".video_url", "the data is mp4/mov (ISO base media), not a supported video container; send AVI with Motion-JPEG video", "", ""},
		{"an AVI cut short", open, dataURL("video_url", "video/x-msvideo", avi[:3000]), ".video_url", "not a valid AVI file: its \"RIFF\" chunk in the file declares", "", ""},
		{"an H.264 AVI", open, dataURL("video_url", "video/x-msvideo", bytes.ReplaceAll(avi, []byte("MJPG"), []byte("H264"))), ".video_url", `AVI video encoded as "H264" (handler "H264") is not supported`, "", ""},
		{"use_audio_in_video without an audio track", open, dataURL("video_url", "video/x-msvideo", bytes.ReplaceAll(avi, []byte("auds"), []byte("txts"))), ".video_url",
			"mm_processor_kwargs.use_audio_in_video is set, but the video has no audio track", "", `"mm_processor_kwargs":{"use_audio_in_video":true},`},

		{"http media not allowed", inline, url("image_url", "http://example.com/cat.png"), ".image_url", "this server does not fetch media from http(s) URLs; send it inline", "", ""},
		{"a host not allowed", strict, url("image_url", "http://example.com/cat.png"), ".image_url", "this server does not fetch media from example.com: it is not one of the allowed media domains", "", ""},
		{"a private address", strict, url("image_url", "http://localhost:"+port+"/cat.png"), ".image_url", "this server does not fetch media from private, loopback or link-local addresses", "127.0.0.1 is not a public address", ""},
		{"a redirect", open, url("image_url", upstream.URL+"/redirect.png"), ".image_url", "the URL redirects, and this server follows no redirects", "", ""},
		{"a 404", open, url("image_url", upstream.URL+"/cat.png"), ".image_url", "fetching it failed: the server answered 404 Not Found", "", ""},
		{"a refused connection", open, url("image_url", "http://127.0.0.1:1/cat.png"), ".image_url", "fetching it failed: the connection was refused", "connection refused", ""},
		{"a fetch that times out", open, url("image_url", upstream.URL+"/hang.png"), ".image_url", "fetching it timed out after 200ms", "", ""},
		{"a download too large", open, url("image_url", upstream.URL+"/big.png"), ".image_url", "the media is 2097152 bytes, over this server's limit of 1048576", "", ""},
		{"local files not allowed", inline, url("audio_url", "file:///etc/hostname"), ".audio_url", "this server does not read media from file: URLs", "", ""},
		{"a file outside the allowed path", open, url("audio_url", "file:///etc/hostname"), ".audio_url", "the file is not beneath this server's allowed local media path", "", ""},
		{"a missing file", open, url("audio_url", "file://"+filepath.Join(local, "nope.wav")), ".audio_url", "the file does not exist", "no such file or directory", ""},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := fmt.Sprintf("media-error-%d", i)
			body := `{"messages":[{"role":"user","content":"hi"},{"role":"user","content":[{"type":"text","text":"look"},` + c.part + `]}],` + c.extra + `"max_tokens":2}`
			status, raw := postWithID(t, c.server+"/v1/chat/completions", id, body)
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
				} `json:"error"`
			}
			if status != http.StatusBadRequest || json.Unmarshal(raw, &e) != nil || e.Error.Type != "invalid_request_error" {
				t.Fatalf("status %d, want 400 with an OpenAI error body: %s", status, raw)
			}
			const part = "messages[1].content[1]"
			if e.Error.Param == nil || *e.Error.Param != part {
				t.Errorf("param %v, want %q", e.Error.Param, part)
			}
			msg := e.Error.Message
			if prefix := part + c.field + ": "; !strings.HasPrefix(msg, prefix) {
				t.Errorf("message %q does not open with %q", msg, prefix)
			}
			if !strings.Contains(msg, c.want) {
				t.Errorf("message %q does not say %q", msg, c.want)
			}
			if w := internalWords.FindString(msg); w != "" {
				t.Errorf("message %q has %q, which is the server's business, not the client's", msg, w)
			}
			logged := logs.about(id)
			if logged.Msg != "request rejected" || !strings.Contains(logged.Err, c.want) || !strings.Contains(logged.Err, c.cause) {
				t.Errorf("the log does not keep the cause %q: %+v", c.cause, logged)
			}
		})
	}
}

func postWithID(t *testing.T, url, id, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+testSecret)
	req.Header.Set("X-Request-Id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// lockedLog collects a worker's log lines while the test reads them.
type lockedLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// loggedLine is what a JSON log line says of a request.
type loggedLine struct {
	Msg       string `json:"msg"`
	RequestID string `json:"request_id"`
	Err       string `json:"err"`
}

// about is the first line logged about request id.
func (l *lockedLog) about(id string) loggedLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	for line := range strings.Lines(l.buf.String()) {
		var ll loggedLine
		if json.Unmarshal([]byte(line), &ll) == nil && ll.RequestID == id {
			return ll
		}
	}
	return loggedLine{}
}

// longWAV is 8-bit mono WAV at 1 kHz, the least bytes a second of audio
// the decoder takes can have.
func longWAV(seconds int) []byte {
	n := seconds * 1000
	var b bytes.Buffer
	b.WriteString("RIFF")
	_ = binary.Write(&b, binary.LittleEndian, uint32(36+n))
	b.WriteString("WAVEfmt ")
	for _, v := range []any{uint32(16), uint16(1), uint16(1), uint32(1000), uint32(1000), uint16(1), uint16(8)} {
		_ = binary.Write(&b, binary.LittleEndian, v)
	}
	b.WriteString("data")
	_ = binary.Write(&b, binary.LittleEndian, uint32(n))
	b.Write(bytes.Repeat([]byte{128}, n))
	return b.Bytes()
}

// pngOfSize is a PNG whose header, checksum and all, declares w×h pixels
// while its data holds 8×8: a decompression bomb's first bytes.
func pngOfSize(w, h int) []byte {
	b := pngBytes(8, 8)
	binary.BigEndian.PutUint32(b[16:], uint32(w))
	binary.BigEndian.PutUint32(b[20:], uint32(h))
	binary.BigEndian.PutUint32(b[29:], crc32.ChecksumIEEE(b[12:29]))
	return b
}

func patterned(w, h int) image.Image {
	m := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			m.Set(x, y, color.RGBA{uint8(x * 16), uint8(y * 16), uint8(x ^ y), 255})
		}
	}
	return m
}
