package stageconn

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"

	"github.com/omnipd/omnipd/stageapi"
)

// The wire form: magic "OCND", version 1, then little-endian uint32 counts
// (rows, width, hidden width, tts width, tokens, prompt tokens), then the
// float32 rows and int32 ids, little-endian, with no per-element framing.
var magic = [4]byte{'O', 'C', 'N', 'D'}

const version = 1

// maxElements bounds what a decoder accepts (about 1 GiB of float32).
const maxElements = 1 << 28

// Encode writes a stash in the wire form.
func Encode(st *Stash) ([]byte, error) {
	width, hwidth := rowWidth(st.Embed), rowWidth(st.Hidden)
	if len(st.Embed) != len(st.Hidden) {
		return nil, fmt.Errorf("stageconn: %d embed rows but %d hidden rows", len(st.Embed), len(st.Hidden))
	}
	tts := len(st.TTSPad)
	if len(st.TTSBos) != tts || len(st.TTSEos) != tts {
		return nil, errors.New("stageconn: the three TTS embeddings differ in width")
	}
	var b bytes.Buffer
	b.Write(magic[:])
	b.WriteByte(version)
	for _, n := range []int{len(st.Embed), width, hwidth, tts, len(st.TokenIDs), len(st.PromptTokenIDs)} {
		_ = binary.Write(&b, binary.LittleEndian, uint32(n))
	}
	for _, rows := range [][][]float32{st.Embed, st.Hidden} {
		for _, r := range rows {
			if len(r) != rowWidth(rows) {
				return nil, errors.New("stageconn: rows of different widths")
			}
			_ = binary.Write(&b, binary.LittleEndian, r)
		}
	}
	for _, v := range [][]float32{st.TTSPad, st.TTSBos, st.TTSEos} {
		_ = binary.Write(&b, binary.LittleEndian, v)
	}
	for _, ids := range [][]int{st.TokenIDs, st.PromptTokenIDs} {
		for _, id := range ids {
			_ = binary.Write(&b, binary.LittleEndian, int32(id))
		}
	}
	return b.Bytes(), nil
}

func rowWidth(rows [][]float32) int {
	if len(rows) == 0 {
		return 0
	}
	return len(rows[0])
}

// Decode reads the wire form, refusing anything inconsistent.
func Decode(data []byte) (*Stash, error) {
	r := bytes.NewReader(data)
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil || [4]byte(head[:4]) != magic || head[4] != version {
		return nil, errors.New("stageconn: not a conditioning stash")
	}
	var counts [6]uint32
	if err := binary.Read(r, binary.LittleEndian, &counts); err != nil {
		return nil, fmt.Errorf("stageconn: truncated header: %w", err)
	}
	rows, width, hwidth, tts, ntok, nprompt := int(counts[0]), int(counts[1]), int(counts[2]), int(counts[3]), int(counts[4]), int(counts[5])
	total := uint64(rows)*uint64(width) + uint64(rows)*uint64(hwidth) + 3*uint64(tts) + uint64(ntok) + uint64(nprompt)
	if total > maxElements || uint64(r.Len()) != 4*total {
		return nil, fmt.Errorf("stageconn: stash of %d bytes does not match its header", len(data))
	}
	st := &Stash{}
	readRows := func(w int) [][]float32 {
		out := make([][]float32, rows)
		for i := range out {
			out[i] = make([]float32, w)
			_ = binary.Read(r, binary.LittleEndian, out[i])
		}
		return out
	}
	st.Embed, st.Hidden = readRows(width), readRows(hwidth)
	for _, dst := range []*[]float32{&st.TTSPad, &st.TTSBos, &st.TTSEos} {
		*dst = make([]float32, tts)
		_ = binary.Read(r, binary.LittleEndian, *dst)
	}
	readIDs := func(n int) []int {
		raw := make([]int32, n)
		_ = binary.Read(r, binary.LittleEndian, raw)
		out := make([]int, n)
		for i, v := range raw {
			out[i] = int(v)
		}
		return out
	}
	st.TokenIDs, st.PromptTokenIDs = readIDs(ntok), readIDs(nprompt)
	for _, rs := range [][][]float32{st.Embed, st.Hidden} {
		for _, row := range rs {
			for _, v := range row {
				if math.IsNaN(float64(v)) {
					return nil, errors.New("stageconn: NaN in the conditioning rows")
				}
			}
		}
	}
	return st, nil
}

// Fetch takes a stash from the worker at baseURL: the worker frees it once
// sent.
func Fetch(ctx context.Context, client *http.Client, baseURL, key, secret string) (*Stash, error) {
	body, err := call(ctx, client, http.MethodGet, baseURL, key, secret)
	if err != nil {
		return nil, err
	}
	return Decode(body)
}

// Release drops a stash that will not be fetched (the request failed or
// was cancelled), rather than leaving it to the TTL.
func Release(ctx context.Context, client *http.Client, baseURL, key, secret string) error {
	_, err := call(ctx, client, http.MethodDelete, baseURL, key, secret)
	return err
}

func call(ctx context.Context, client *http.Client, method, baseURL, key, secret string) ([]byte, error) {
	body, _, err := callHeader(ctx, client, method, baseURL, url.PathEscape(key), secret)
	return body, err
}

// callHeader does one request on the stash at Path+target (an escaped key,
// perhaps with a query) and returns the body and header of a success.
func callHeader(ctx context.Context, client *http.Client, method, baseURL, target, secret string) ([]byte, http.Header, error) {
	key, _, _ := strings.Cut(target, "?")
	if k, err := url.PathUnescape(key); err == nil {
		key = k
	}
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, method, baseURL+stageapi.ConditioningPath+target, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("stageconn: %w", err)
	}
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("stageconn: %s %s: %w", method, key, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4*maxElements+64))
	if err != nil {
		return nil, nil, fmt.Errorf("stageconn: read %s: %w", key, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, nil, fmt.Errorf("%w: %q at %s", ErrNotFound, key, baseURL)
	case resp.StatusCode == http.StatusUnauthorized:
		return nil, nil, fmt.Errorf("%w at %s", ErrAuth, baseURL)
	case resp.StatusCode >= 300:
		return nil, nil, fmt.Errorf("stageconn: %s %s: HTTP %d: %s", method, key, resp.StatusCode, bytes.TrimSpace(body))
	}
	return body, resp.Header, nil
}
