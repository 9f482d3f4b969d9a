package mediafetch

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/omnipd/omnipd/openai"
)

const testPath = "messages[0].content[1]"

// errTooManyRedirects stands for ErrFetch raised by the redirect cap, so the
// loop test cannot pass on some other fetch failure.
var errTooManyRedirects = errors.New("redirects more than 5 times")

func newFetcher(t *testing.T, p Policy) *Fetcher {
	t.Helper()
	f, err := NewFetcher(p)
	if err != nil {
		t.Fatalf("NewFetcher: %v", err)
	}
	return f
}

// checkErr asserts err is a *PartError naming testPath and wrapping want
// (nil: no error).
func checkErr(t *testing.T, err, want error) {
	t.Helper()
	if want == nil {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	if want == errTooManyRedirects {
		if !errors.Is(err, ErrFetch) || !strings.Contains(err.Error(), want.Error()) {
			t.Fatalf("err = %v, want ErrFetch for %v", err, want)
		}
	} else if !errors.Is(err, want) {
		t.Fatalf("err = %v, want %v", err, want)
	}
	var pe *PartError
	if !errors.As(err, &pe) || pe.Path != testPath {
		t.Fatalf("err = %v, want a *PartError for %s", err, testPath)
	}
}

func item(kind openai.MediaKind, u string) openai.MediaItem {
	return openai.MediaItem{Path: testPath, Kind: kind, URL: u}
}

// hostOf is the host of an httptest server's URL, e.g. "127.0.0.1".
func hostOf(t *testing.T, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Hostname()
}

func TestZeroPolicyIsInlineOnly(t *testing.T) {
	f := newFetcher(t, Policy{})
	png := "data:image/png;base64," + base64.StdEncoding.EncodeToString([]byte("png!"))
	tests := []struct {
		name string
		item openai.MediaItem
		want error
	}{
		{"data URL", item(openai.MediaImage, png), nil},
		{"inline audio", openai.MediaItem{Path: testPath, Kind: openai.MediaAudio, Data: "AAAA", Format: "wav"}, nil},
		{"http", item(openai.MediaImage, "http://127.0.0.1:1/a.png"), ErrNotAllowed},
		{"https", item(openai.MediaImage, "https://example.com/a.png"), ErrNotAllowed},
		{"file", item(openai.MediaImage, "file:///etc/hostname"), ErrNotAllowed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.Fetch(t.Context(), tt.item)
			checkErr(t, err, tt.want)
		})
	}
}

func TestDataURLs(t *testing.T) {
	const limit = 16
	f := newFetcher(t, Policy{MaxBytes: limit})
	enc := base64.StdEncoding.EncodeToString
	tests := []struct {
		name string
		item openai.MediaItem
		want []byte
		err  error
	}{
		{"base64 image", item(openai.MediaImage, "data:image/png;base64,"+enc([]byte("png bytes"))), []byte("png bytes"), nil},
		{"params before base64", item(openai.MediaAudio, "data:audio/wav;rate=16000;base64,"+enc([]byte("wav"))), []byte("wav"), nil},
		{"percent-encoded", item(openai.MediaImage, "data:image/svg+xml,%3Csvg%2F%3E"), []byte("<svg/>"), nil},
		{"exactly at the cap", item(openai.MediaVideo, "data:video/mp4;base64,"+enc(make([]byte, limit))), make([]byte, limit), nil},
		{"bad base64", item(openai.MediaImage, "data:image/png;base64,!!!!"), nil, ErrBadURL},
		{"bad padding", item(openai.MediaImage, "data:image/png;base64,AAA"), nil, ErrBadURL},
		{"bad percent", item(openai.MediaImage, "data:image/svg+xml,%zz"), nil, ErrBadURL},
		{"wrong media type", item(openai.MediaAudio, "data:image/png;base64,"+enc([]byte("png"))), nil, ErrBadURL},
		{"no media type", item(openai.MediaImage, "data:;base64,"+enc([]byte("x"))), nil, ErrBadURL},
		{"video/jpeg frame list", item(openai.MediaVideo, "data:video/jpeg;base64,"+enc([]byte("a"))+","+enc([]byte("b"))), nil, ErrBadURL},
		{"missing comma", item(openai.MediaImage, "data:image/png;base64"), nil, ErrBadURL},
		{"over cap", item(openai.MediaImage, "data:image/png;base64,"+enc(make([]byte, limit+1))), nil, ErrTooLarge},
		// Invalid base64 over the cap is refused as too large: the size is
		// judged from the length, before any decoding.
		{"over cap, never decoded", item(openai.MediaImage, "data:image/png;base64,"+strings.Repeat("!", 4*limit)), nil, ErrTooLarge},
		{"percent over cap", item(openai.MediaImage, "data:image/svg+xml,"+strings.Repeat("%41", limit+1)), nil, ErrTooLarge},
		{"inline audio over cap", openai.MediaItem{Path: testPath, Kind: openai.MediaAudio, Data: enc(make([]byte, limit+1)), Format: "wav"}, nil, ErrTooLarge},
		{"inline audio bad base64", openai.MediaItem{Path: testPath, Kind: openai.MediaAudio, Data: "####", Format: "wav"}, nil, ErrBadURL},
		{"no source", openai.MediaItem{Path: testPath, Kind: openai.MediaAudio}, nil, ErrBadURL},
		{"unknown kind", openai.MediaItem{Path: testPath, Kind: "smell", URL: "data:smell/x;base64,AAAA"}, nil, ErrBadURL},
		{"unsupported scheme", item(openai.MediaImage, "ftp://example.com/a.png"), nil, ErrBadURL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := f.Fetch(t.Context(), tt.item)
			checkErr(t, err, tt.err)
			if tt.err == nil && !bytes.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// mediaServer serves a few fixed routes for the HTTP tests.
func mediaServer(t *testing.T) *httptest.Server {
	t.Helper()
	release := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/ok.png", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("image bytes"))
	})
	mux.HandleFunc("/missing.png", http.NotFound)
	mux.HandleFunc("/boom", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "upstream broke", http.StatusBadGateway)
	})
	// Both big routes then hang rather than finish their body: a fetcher
	// that read on past the cap would time out instead of failing fast.
	hang := func(r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}
	mux.HandleFunc("/big-declared", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1000")
		w.Write(make([]byte, 10))
		w.(http.Flusher).Flush()
		hang(r)
	})
	mux.HandleFunc("/big-chunked", func(w http.ResponseWriter, r *http.Request) {
		// Flushing before writing the body makes the response chunked, so
		// no Content-Length announces the size.
		w.(http.Flusher).Flush()
		w.Write(make([]byte, 101))
		w.(http.Flusher).Flush()
		hang(r)
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) { hang(r) })
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/loop", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		close(release)
		srv.Close()
	})
	return srv
}

func TestHTTP(t *testing.T) {
	srv := mediaServer(t)
	host := hostOf(t, srv.URL)
	// Same server, reached by a name that is not on the allow list.
	other := strings.Replace(srv.URL, host, "localhost", 1)
	base := Policy{
		AllowedDomains:       []string{host},
		AllowPrivateNetworks: true, // httptest listens on loopback
		MaxRedirects:         VLLMMaxRedirects,
		MaxBytes:             100,
		ImageTimeout:         100 * time.Millisecond,
	}
	tests := []struct {
		name   string
		policy func(*Policy)
		url    string
		want   []byte
		err    error
	}{
		{"allowed host", nil, srv.URL + "/ok.png", []byte("image bytes"), nil},
		{"host case is ignored", nil, strings.Replace(srv.URL, "http://", "HTTP://", 1) + "/ok.png", []byte("image bytes"), nil},
		{"disallowed host", nil, other + "/ok.png", nil, ErrNotAllowed},
		{"subdomain is not the domain", func(p *Policy) { p.AllowedDomains = []string{"localhost"} }, strings.Replace(srv.URL, host, "sub.localhost", 1) + "/ok.png", nil, ErrNotAllowed},
		{"redirect to allowed host", nil, srv.URL + "/redirect?to=/ok.png", []byte("image bytes"), nil},
		{"redirect to disallowed host", nil, srv.URL + "/redirect?to=" + url.QueryEscape(other+"/ok.png"), nil, ErrNotAllowed},
		{"redirect to another scheme", nil, srv.URL + "/redirect?to=" + url.QueryEscape("file:///etc/hostname"), nil, ErrNotAllowed},
		{"redirects off", func(p *Policy) { p.MaxRedirects = 0 }, srv.URL + "/redirect?to=/ok.png", nil, ErrNotAllowed},
		{"redirect loop", nil, srv.URL + "/loop", nil, errTooManyRedirects},
		{"private address refused", func(p *Policy) { p.AllowPrivateNetworks = false }, srv.URL + "/ok.png", nil, ErrNotAllowed},
		{"any domain still blocks private", func(p *Policy) { p.AllowedDomains, p.AllowAnyDomain, p.AllowPrivateNetworks = nil, true, false }, other + "/ok.png", nil, ErrNotAllowed},
		{"any domain", func(p *Policy) { p.AllowedDomains, p.AllowAnyDomain = nil, true }, other + "/ok.png", []byte("image bytes"), nil},
		{"404", nil, srv.URL + "/missing.png", nil, ErrFetch},
		{"502", nil, srv.URL + "/boom", nil, ErrFetch},
		{"over cap by Content-Length", nil, srv.URL + "/big-declared", nil, ErrTooLarge},
		{"over cap without Content-Length", nil, srv.URL + "/big-chunked", nil, ErrTooLarge},
		{"slow server", nil, srv.URL + "/slow", nil, ErrTimeout},
		{"connection refused", nil, "http://" + host + ":1/ok.png", nil, ErrFetch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := base
			if tt.policy != nil {
				tt.policy(&p)
			}
			got, err := newFetcher(t, p).Fetch(t.Context(), item(openai.MediaImage, tt.url))
			checkErr(t, err, tt.err)
			if tt.err == nil && !bytes.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestHTTPStatusError(t *testing.T) {
	srv := mediaServer(t)
	f := newFetcher(t, Policy{AllowedDomains: []string{hostOf(t, srv.URL)}, AllowPrivateNetworks: true})
	_, err := f.Fetch(t.Context(), item(openai.MediaImage, srv.URL+"/missing.png"))
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusNotFound {
		t.Fatalf("err = %v, want a StatusError 404", err)
	}
}

func TestCallerCancellationIsNotATimeout(t *testing.T) {
	srv := mediaServer(t)
	f := newFetcher(t, Policy{AllowedDomains: []string{hostOf(t, srv.URL)}, AllowPrivateNetworks: true})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := f.Fetch(ctx, item(openai.MediaImage, srv.URL+"/slow"))
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want context.Canceled and not ErrTimeout", err)
	}
}

func TestFileURLs(t *testing.T) {
	dir := t.TempDir()
	allowed := filepath.Join(dir, "media")
	outside := filepath.Join(dir, "secret")
	for _, d := range []string{allowed, outside, filepath.Join(allowed, "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(path string, data []byte) {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(allowed, "a.wav"), []byte("wav bytes"))
	write(filepath.Join(allowed, "sub", "b.wav"), []byte("b"))
	write(filepath.Join(allowed, "big.wav"), make([]byte, 101))
	write(filepath.Join(outside, "key.wav"), []byte("secret"))
	symlink := func(target, name string) {
		if err := os.Symlink(target, filepath.Join(allowed, name)); err != nil {
			t.Skipf("symlinks unavailable: %v", err)
		}
	}
	symlink(filepath.Join(outside, "key.wav"), "escape.wav")
	symlink(outside, "escape-dir")
	symlink(filepath.Join(allowed, "a.wav"), "inside.wav")
	symlink("/nonexistent-target", "dangling.wav")

	fileURL := func(p string) string { return (&url.URL{Scheme: "file", Path: p}).String() }
	f := newFetcher(t, Policy{AllowedLocalPath: allowed, MaxBytes: 100})
	tests := []struct {
		name string
		url  string
		want []byte
		err  error
	}{
		{"inside", fileURL(filepath.Join(allowed, "a.wav")), []byte("wav bytes"), nil},
		{"nested", fileURL(filepath.Join(allowed, "sub", "b.wav")), []byte("b"), nil},
		{"localhost host", "file://localhost" + filepath.ToSlash(filepath.Join(allowed, "a.wav")), []byte("wav bytes"), nil},
		{"symlink staying inside", fileURL(filepath.Join(allowed, "inside.wav")), []byte("wav bytes"), nil},
		{"dot-dot back inside", fileURL(filepath.Join(allowed, "sub") + "/../a.wav"), []byte("wav bytes"), nil},
		{"outside", fileURL(filepath.Join(outside, "key.wav")), nil, ErrNotAllowed},
		{"dot-dot escape", fileURL(allowed + "/../secret/key.wav"), nil, ErrNotAllowed},
		{"symlink escape", fileURL(filepath.Join(allowed, "escape.wav")), nil, ErrNotAllowed},
		{"symlinked dir escape", fileURL(filepath.Join(allowed, "escape-dir", "key.wav")), nil, ErrNotAllowed},
		{"the directory itself", fileURL(allowed), nil, ErrNotAllowed},
		{"missing inside", fileURL(filepath.Join(allowed, "nope.wav")), nil, ErrFetch},
		{"missing outside says not allowed", fileURL(filepath.Join(outside, "nope.wav")), nil, ErrNotAllowed},
		{"missing behind an escaping symlink says not allowed", fileURL(filepath.Join(allowed, "escape-dir", "nope.wav")), nil, ErrNotAllowed},
		{"missing in a missing dir inside", fileURL(filepath.Join(allowed, "nodir", "nope.wav")), nil, ErrFetch},
		{"dangling symlink", fileURL(filepath.Join(allowed, "dangling.wav")), nil, ErrFetch},
		{"a directory", fileURL(filepath.Join(allowed, "sub")), nil, ErrFetch},
		{"over cap", fileURL(filepath.Join(allowed, "big.wav")), nil, ErrTooLarge},
		{"remote host", "file://otherhost" + filepath.ToSlash(filepath.Join(allowed, "a.wav")), nil, ErrBadURL},
		{"relative", "file:a.wav", nil, ErrBadURL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := f.Fetch(t.Context(), item(openai.MediaAudio, tt.url))
			checkErr(t, err, tt.err)
			if tt.err == nil && !bytes.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}

	t.Run("allowed path given through a symlink", func(t *testing.T) {
		link := filepath.Join(dir, "media-link")
		if err := os.Symlink(allowed, link); err != nil {
			t.Skipf("symlinks unavailable: %v", err)
		}
		f := newFetcher(t, Policy{AllowedLocalPath: link})
		got, err := f.Fetch(t.Context(), item(openai.MediaAudio, fileURL(filepath.Join(link, "a.wav"))))
		checkErr(t, err, nil)
		if string(got) != "wav bytes" {
			t.Errorf("got %q", got)
		}
	})
}

func TestNewFetcherRefuses(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		p    Policy
	}{
		{"missing local path", Policy{AllowedLocalPath: filepath.Join(dir, "nope")}},
		{"local path is a file", Policy{AllowedLocalPath: file}},
		{"domain with scheme", Policy{AllowedDomains: []string{"https://example.com"}}},
		{"domain with port", Policy{AllowedDomains: []string{"example.com:443"}}},
		{"wildcard domain", Policy{AllowedDomains: []string{"*.example.com"}}},
		{"negative bytes", Policy{MaxBytes: -1}},
		{"negative timeout", Policy{VideoTimeout: -time.Second}},
	}
	for _, tt := range tests {
		if _, err := NewFetcher(tt.p); err == nil {
			t.Errorf("%s: NewFetcher succeeded, want an error", tt.name)
		}
	}
	if _, err := NewFetcher(Policy{AllowedDomains: []string{"Example.COM", "[::1]", "::1", "127.0.0.1"}}); err != nil {
		t.Errorf("valid domains refused: %v", err)
	}
}

func TestBlockedAddresses(t *testing.T) {
	f := newFetcher(t, Policy{})
	for _, tt := range []struct {
		addr    string
		blocked bool
	}{
		{"127.0.0.1", true}, {"10.1.2.3", true}, {"172.16.0.1", true}, {"192.168.1.1", true},
		{"169.254.169.254", true}, {"100.64.0.1", true}, {"0.0.0.0", true}, {"224.0.0.1", true},
		{"::1", true}, {"fe80::1", true}, {"fc00::1", true}, {"::ffff:169.254.169.254", true},
		{"2002::1", true}, {"64:ff9b::a9fe:a9fe", true},
		{"8.8.8.8", false}, {"93.184.216.34", false}, {"2606:4700::1111", false},
	} {
		if got := f.isBlocked(netip.MustParseAddr(tt.addr)); got != tt.blocked {
			t.Errorf("isBlocked(%s) = %v, want %v", tt.addr, got, tt.blocked)
		}
	}
}

func TestFetchAll(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/fail":
			http.NotFound(w, r)
		case "/hang":
			// Only the cancellation FetchAll makes on the first failure
			// ends this request: the timeout is far away.
			select {
			case <-r.Context().Done():
			case <-release:
			}
		default:
			w.Write([]byte(strings.TrimPrefix(r.URL.Path, "/")))
		}
	}))
	t.Cleanup(func() {
		close(release)
		srv.Close()
	})
	f := newFetcher(t, Policy{
		AllowedDomains:       []string{hostOf(t, srv.URL)},
		AllowPrivateNetworks: true,
		Concurrency:          2,
		ImageTimeout:         time.Hour,
	})
	at := func(i int, path string) openai.MediaItem {
		return openai.MediaItem{Path: "messages[0].content[" + strconv.Itoa(i) + "]", Kind: openai.MediaImage, URL: srv.URL + path}
	}

	t.Run("all succeed in order", func(t *testing.T) {
		items := []openai.MediaItem{
			at(0, "/a"), at(1, "/b"), at(2, "/c"),
			{Path: "messages[0].content[3]", Kind: openai.MediaImage, URL: "data:image/png;base64," + base64.StdEncoding.EncodeToString([]byte("d"))},
			at(4, "/e"),
		}
		got, err := f.FetchAll(t.Context(), items)
		if err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, b := range got {
			s = append(s, string(b))
		}
		if strings.Join(s, ",") != "a,b,c,d,e" {
			t.Errorf("got %v, want a,b,c,d,e", s)
		}
	})

	t.Run("first failure cancels the rest", func(t *testing.T) {
		items := []openai.MediaItem{at(0, "/hang"), at(1, "/fail"), at(2, "/hang"), at(3, "/a")}
		got, err := f.FetchAll(t.Context(), items)
		if got != nil || !errors.Is(err, ErrFetch) {
			t.Fatalf("got %v, %v; want ErrFetch", got, err)
		}
		var pe *PartError
		if !errors.As(err, &pe) || pe.Path != "messages[0].content[1]" {
			t.Errorf("err = %v, want it to name messages[0].content[1]", err)
		}
	})

	t.Run("empty", func(t *testing.T) {
		got, err := f.FetchAll(t.Context(), nil)
		if err != nil || len(got) != 0 {
			t.Errorf("got %v, %v", got, err)
		}
	})
}
