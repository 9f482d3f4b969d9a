package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/reference/eccache"
	"github.com/omnipd/omnipd/reference/engine/mmproc"
)

// ReferenceECConnector is the encoder-cache connector of reference workers
// (E/P/D): an encoder worker keeps each media item's encoder rows under the
// item's content hash, and a prefill worker fetches them from it, worker to
// worker, instead of encoding (docs/encoder-disaggregation.md). It takes
// the place of vLLM's EC connectors (ECExampleConnector and others), which
// key encoder outputs by the item's multimodal hash the same way.
const ReferenceECConnector = kvconnector.ReferenceECConnector

// EC roles, as vLLM's ECTransferConfig names them.
const (
	ECProducer = "ec_producer" // the encoder: runs the encoders, keeps their rows
	ECConsumer = "ec_consumer" // the prefill: takes the rows instead of encoding
)

// ECTransferConfig is vLLM's --ec-transfer-config, as the reference worker
// reads it.
type ECTransferConfig struct {
	Connector   string         `json:"ec_connector"`
	Role        string         `json:"ec_role"`
	EngineID    string         `json:"engine_id,omitempty"`
	ExtraConfig map[string]any `json:"ec_connector_extra_config,omitempty"`
}

// ParseECTransferConfig parses --ec-transfer-config; empty is none.
func ParseECTransferConfig(s string) (*ECTransferConfig, error) {
	if s == "" {
		return nil, nil
	}
	var c ECTransferConfig
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		return nil, fmt.Errorf("--ec-transfer-config: %w", err)
	}
	if c.Connector != ReferenceECConnector {
		return nil, fmt.Errorf("--ec-transfer-config: ec_connector %q: the reference worker moves encoder outputs only with %s", c.Connector, ReferenceECConnector)
	}
	if c.Role != ECProducer && c.Role != ECConsumer {
		return nil, fmt.Errorf("--ec-transfer-config: ec_role %q: want %s or %s", c.Role, ECProducer, ECConsumer)
	}
	return &c, nil
}

// EncoderCacheHandle names one media item's encoder rows.
type EncoderCacheHandle struct {
	URL string `json:"url,omitempty"`
	Key string `json:"key"`
}

// contentKey is a media item's content hash: what it is and how it is
// processed (its kind; a video's own audio heard or not) and its bytes. An
// encoder worker stores the item's rows under it, and a prefill checks that
// the rows it is handed are its item's.
func contentKey(kind mmproc.Kind, useAudioInVideo bool, data []byte) string {
	h := sha256.New()
	fmt.Fprintf(h, "omnipd-mm-v1\x00%d\x00%t\x00", kind, useAudioInVideo && kind == mmproc.Video)
	h.Write(data)
	return "sha256-" + hex.EncodeToString(h.Sum(nil))
}

// encodeItems runs the encoders on each item of an encoder worker's request
// and stores the rows; the answer names the keys.
func (s *Server) encodeItems(w http.ResponseWriter, r *http.Request, rm *requestMedia, extra map[string]json.RawMessage) error {
	id := r.Header.Get(openai.RequestIDHeader)
	if id == "" {
		id = strconv.FormatInt(time.Now().UnixNano(), 16)
	}
	lease := id
	if raw, ok := extra[openai.EncoderCacheMember]; ok {
		var asked struct {
			Lease string `json:"lease"`
		}
		if err := json.Unmarshal(raw, &asked); err != nil || asked.Lease == "" {
			return openai.InvalidRequest(openai.EncoderCacheMember, `an encoder leg takes {"lease": <name>}`)
		}
		lease = asked.Lease
	}
	sim := s.eng.Simulation()
	if sim != nil {
		if err := s.media.simulateEncoders(r.Context(), sim, rm); err != nil {
			return err
		}
	}
	handles := make([]EncoderCacheHandle, len(rm.items))
	tokens := 0
	for i, mi := range rm.items {
		var e *eccache.Entry
		var err error
		if sim != nil {
			// The simulated prefill computes nothing from the rows: the
			// entry says how many there are, with no values to move.
			e = simEntry(mi)
		} else if e, err = s.media.encodeEntry(mi); err != nil {
			return fmt.Errorf("%s: %w", mi.path, err)
		}
		if err := s.encoded.Put(mi.key, lease, e); err != nil {
			if errors.Is(err, eccache.ErrReleased) {
				// The request ended while this leg was on its way.
				return openai.Upstream(http.StatusConflict, "encoder_lease_released", err.Error())
			}
			return err
		}
		handles[i] = EncoderCacheHandle{Key: mi.key}
		tokens += len(e.Audio) + len(e.Vision)
	}
	// The answer of vLLM's encoder instance is not read by its proxy; this
	// one is a chat completion with no text and the keys beside it.
	writeJSON(w, http.StatusOK, map[string]any{
		"id": "chatcmpl-" + id, "object": "chat.completion", "created": time.Now().Unix(), "model": s.cfg.ModelName,
		"choices":                 []map[string]any{{"index": 0, "message": map[string]any{"role": "assistant", "content": ""}, "finish_reason": "length"}},
		"usage":                   map[string]any{"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens},
		openai.EncoderCacheMember: handles,
	})
	return nil
}

// encoderHandles reads the prefill leg's handles, one per media item.
func encoderHandles(extra map[string]json.RawMessage, items int) ([]EncoderCacheHandle, error) {
	raw, ok := extra[openai.EncoderCacheMember]
	if !ok {
		return nil, nil
	}
	var hs []EncoderCacheHandle
	if err := json.Unmarshal(raw, &hs); err != nil {
		return nil, openai.InvalidRequest(openai.EncoderCacheMember, "want a list of {url, key}: "+err.Error())
	}
	if len(hs) != items {
		return nil, openai.InvalidRequest(openai.EncoderCacheMember, fmt.Sprintf("%d handles for %d media items", len(hs), items))
	}
	for i, h := range hs {
		if h.URL == "" || h.Key == "" {
			return nil, openai.InvalidRequest(fmt.Sprintf("%s[%d]", openai.EncoderCacheMember, i), "want a url and a key")
		}
	}
	return hs, nil
}

// fetchEncoded takes each item's rows from the encoder workers the handles
// name, checking that each key is its item's content hash, so that the
// prefill encodes nothing. A missing entry or an unreachable encoder fails
// the request: the orchestrator said the rows were there.
func (s *Server) fetchEncoded(ctx context.Context, rm *requestMedia, hs []EncoderCacheHandle) error {
	for i, h := range hs {
		mi := &rm.items[i]
		if h.Key != mi.key {
			return openai.InvalidRequest(mi.path, fmt.Sprintf("the encoder output %q handed for this item is another item's (its content hash is %q)", h.Key, mi.key))
		}
		fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		e, err := eccache.Fetch(fctx, s.client, h.URL, h.Key, s.cfg.Secret)
		cancel()
		if err != nil {
			// The encoder worker died, or released them: a 502 the
			// orchestrator classifies like any failed prefill.
			return openai.Upstream(http.StatusBadGateway, "encoder_output_unavailable", fmt.Sprintf("%s: the encoder's output could not be fetched: %v", mi.path, err))
		}
		mi.encoded = e
	}
	return nil
}

// errNoMedia: an encoder worker asked for text only.
var errNoMedia = openai.InvalidRequest("messages", "this worker is an encoder (--ec-transfer-config ec_role ec_producer): send it media items, one per request, as vLLM's disaggregated-encoder proxy does")

// simEntry is an item's entry in simulate mode: rows of no width, as many
// as the item's placeholders.
func simEntry(mi mediaItem) *eccache.Entry {
	audio, vision := mi.tokens()
	return &eccache.Entry{Audio: make([][]float32, audio), Vision: make([][]float32, vision)}
}
