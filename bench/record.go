package bench

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/omnipd/omnipd/audio"
	"github.com/omnipd/omnipd/openai"
)

// Record is one request as the client saw it. Latencies are measured from
// the moment the request was handed to the HTTP client, in milliseconds.
type Record struct {
	Index     int    `json:"index"`
	RequestID string `json:"request_id"`
	// SentAtMS is when the request was sent, from the start of its run.
	SentAtMS float64 `json:"sent_at_ms"`
	Success  bool    `json:"success"`
	// Canceled requests were cut off by the end of the benchmark (an
	// interrupt); they count neither as completed nor as failed.
	Canceled bool   `json:"canceled,omitempty"`
	Status   int    `json:"status"`
	Error    string `json:"error,omitempty"`

	// PromptTokens is usage.prompt_tokens when the server reported it
	// (PromptTokensReported), else the dataset's estimate.
	PromptTokens         int  `json:"prompt_tokens"`
	PromptTokensReported bool `json:"prompt_tokens_reported"`
	MaxTokens            int  `json:"max_tokens"`
	// MediaItems and MediaBytes are the media parts the request carried
	// and the size of their files; RequestBytes is the body sent.
	MediaItems   int `json:"media_items,omitempty"`
	MediaBytes   int `json:"media_bytes,omitempty"`
	RequestBytes int `json:"request_bytes"`
	// OutputTokens is usage.completion_tokens when reported
	// (OutputTokensReported), else the number of text chunks.
	OutputTokens         int  `json:"output_tokens"`
	OutputTokensReported bool `json:"output_tokens_reported"`
	// TextChunks counts the stream's events that carry a text choice.
	TextChunks int       `json:"text_chunks"`
	TTFTMS     float64   `json:"ttft_ms"`
	TPOTMS     float64   `json:"tpot_ms"`
	ITLMS      []float64 `json:"itl_ms"`
	E2EMS      float64   `json:"e2e_ms"`

	// AudioChunks counts events that carry audio.
	AudioChunks    int     `json:"audio_chunks"`
	AudioTTFPMS    float64 `json:"audio_ttfp_ms"`
	AudioDurationS float64 `json:"audio_duration_s"`
	AudioRTF       float64 `json:"audio_rtf"`

	// MetSLO: the request succeeded and met every limit of the run's SLO.
	MetSLO bool `json:"met_slo"`
}

// streamParser measures one response from its events as they arrive: it is
// pure, fed the time of each event since the request was sent.
type streamParser struct {
	rec    *Record
	audio  bool
	format string

	firstText, lastText   time.Duration
	lastChoice            time.Duration
	firstAudio, lastAudio time.Duration
	samples, rate         int
	align, pending        int // WAV frame size and bytes of a partial frame
	outputTokens          int
	outputReported        bool
}

func newStreamParser(rec *Record, t Target) *streamParser {
	return &streamParser{rec: rec, audio: t.Audio, format: t.audioFormat(), rate: audio.SampleRate}
}

// chunk is the union of what chat and completions stream events carry.
type chunk struct {
	Modality string `json:"modality"`
	Choices  []struct {
		Delta *struct {
			Content *string `json:"content"`
		} `json:"delta"`
		Text *string `json:"text"`
	} `json:"choices"`
	Usage *openai.Usage       `json:"usage"`
	Error *openai.ErrorDetail `json:"error"`
}

// event takes one SSE payload that arrived at (since the request was sent).
// An error event or an undecodable chunk is the request's failure.
func (p *streamParser) event(at time.Duration, payload []byte) error {
	var c chunk
	if err := json.Unmarshal(payload, &c); err != nil {
		return fmt.Errorf("event is not a completion chunk: %w", err)
	}
	if c.Error != nil {
		if c.Modality == openai.ModalityAudio {
			return fmt.Errorf("audio failed mid-stream: %s", c.Error.Message)
		}
		return fmt.Errorf("stream failed: %s", c.Error.Message)
	}
	if c.Usage != nil {
		p.usage(*c.Usage)
	}
	if len(c.Choices) == 0 {
		return nil // the usage chunk
	}
	p.lastChoice = at
	if c.Modality == openai.ModalityAudio {
		var content string
		if d := c.Choices[0].Delta; d != nil && d.Content != nil {
			content = *d.Content
		}
		if content == "" {
			return nil // the closing chunk with finish_reason
		}
		if err := p.audioPacket(content); err != nil {
			return fmt.Errorf("audio chunk %d: %w", p.rec.AudioChunks+1, err)
		}
		if p.rec.AudioChunks == 0 {
			p.firstAudio = at
		}
		p.rec.AudioChunks++
		p.lastAudio = at
		return nil
	}
	// A text choice: vllm bench serve's token chunk, content or not.
	p.rec.TextChunks++
	if p.rec.TextChunks == 1 {
		p.rec.TTFTMS = ms(at)
		p.firstText = at
	} else {
		p.rec.ITLMS = append(p.rec.ITLMS, ms(at-p.lastText))
	}
	p.lastText = at
	return nil
}

func (p *streamParser) usage(u openai.Usage) {
	p.outputTokens, p.outputReported = u.CompletionTokens, true
	if u.PromptTokens > 0 {
		p.rec.PromptTokens, p.rec.PromptTokensReported = u.PromptTokens, true
	}
}

// audioPacket decodes one packet (base64 of a small WAV file, or of raw
// s16le PCM) and adds its samples.
func (p *streamParser) audioPacket(b64 string) error {
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return fmt.Errorf("not base64: %w", err)
	}
	switch p.format {
	case "pcm":
		if len(raw)%2 != 0 {
			return fmt.Errorf("%d bytes of 16-bit PCM", len(raw))
		}
		p.samples += len(raw) / 2
	default:
		frames, err := p.wavFrames(raw)
		if err != nil {
			return err
		}
		p.samples += frames
	}
	return nil
}

// wavFrames counts the sample frames of one packet of a WAV stream. A
// packet is usually a whole small WAV file (omnipd and vllm-omni send them
// so); a server may instead split one WAV across packets, its header (with a
// provisional length) in the first and bare samples after, so a packet
// without a RIFF header continues the format of the last header seen.
func (p *streamParser) wavFrames(raw []byte) (int, error) {
	if samples, rate, channels, err := audio.DecodeWAV(raw); err == nil {
		if err := p.setFormat(rate, 2*channels); err != nil {
			return 0, err
		}
		return len(samples) / channels, nil
	}
	if bytes.HasPrefix(raw, []byte("RIFF")) {
		rate, align, data, err := wavHeader(raw)
		if err != nil {
			return 0, err
		}
		if err := p.setFormat(rate, align); err != nil {
			return 0, err
		}
		raw = data
	} else if p.align == 0 {
		return 0, errors.New("neither a WAV file nor the continuation of one")
	}
	p.pending += len(raw)
	frames := p.pending / p.align
	p.pending %= p.align
	return frames, nil
}

func (p *streamParser) setFormat(rate, align int) error {
	if p.align != 0 && (rate != p.rate || align != p.align) {
		return fmt.Errorf("the audio format changed mid-stream (%d Hz, %d-byte frames after %d Hz, %d-byte frames)", rate, align, p.rate, p.align)
	}
	p.rate, p.align = rate, align
	return nil
}

// wavHeader reads a streamed WAV's header leniently: the fmt chunk's rate
// and block alignment, and whatever bytes follow the data chunk's header
// (its declared size may be provisional).
func wavHeader(b []byte) (rate, align int, data []byte, err error) {
	le := binary.LittleEndian
	if len(b) < 12 || string(b[8:12]) != "WAVE" {
		return 0, 0, nil, errors.New("not a RIFF/WAVE file")
	}
	for off := 12; off+8 <= len(b); {
		id, size := string(b[off:off+4]), int(le.Uint32(b[off+4:]))
		body := off + 8
		switch id {
		case "fmt ":
			if len(b)-body < 16 {
				return 0, 0, nil, errors.New("truncated fmt chunk")
			}
			rate, align = int(le.Uint32(b[body+4:])), int(le.Uint16(b[body+12:]))
		case "data":
			if rate <= 0 || align <= 0 {
				return 0, 0, nil, errors.New("data before a valid fmt chunk")
			}
			return rate, align, b[body:], nil
		}
		if size < 0 || size > len(b)-body {
			break
		}
		off = body + size + size%2
	}
	return 0, 0, nil, errors.New("no data chunk in the WAV header")
}

// whole measures a response that arrived as one JSON body (a server that
// does not stream): the first token and the end coincide.
func (p *streamParser) whole(at time.Duration, body []byte) error {
	var resp struct {
		Choices []struct {
			Message struct {
				Content *string `json:"content"`
				Audio   *struct {
					Data string `json:"data"`
				} `json:"audio"`
			} `json:"message"`
			Text *string `json:"text"`
		} `json:"choices"`
		Usage *openai.Usage `json:"usage"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return fmt.Errorf("response is not a completion: %w", err)
	}
	if resp.Usage != nil {
		p.usage(*resp.Usage)
	}
	for _, c := range resp.Choices {
		if c.Message.Audio != nil {
			if err := p.audioPacket(c.Message.Audio.Data); err != nil {
				return fmt.Errorf("audio: %w", err)
			}
			p.rec.AudioChunks++
			p.firstAudio, p.lastAudio = at, at
			continue
		}
		p.rec.TextChunks++
	}
	if p.rec.TextChunks > 0 {
		p.rec.TTFTMS = ms(at)
		p.firstText, p.lastText = at, at
	}
	p.lastChoice = at
	return nil
}

var errNoText = errors.New("the response carried no text choice")

// finish completes the record once the stream ended with [DONE].
func (p *streamParser) finish() error {
	r := p.rec
	if r.TextChunks == 0 {
		return errNoText
	}
	if p.audio && r.AudioChunks == 0 {
		return errors.New("audio was asked for but the response carried none (is the pipeline text-only?)")
	}
	r.E2EMS = ms(p.lastChoice)
	r.OutputTokens, r.OutputTokensReported = p.outputTokens, p.outputReported
	if !p.outputReported {
		r.OutputTokens = r.TextChunks
	}
	if r.OutputTokens > 1 {
		r.TPOTMS = ms(p.lastText-p.firstText) / float64(r.OutputTokens-1)
	}
	if r.AudioChunks > 0 {
		r.AudioTTFPMS = ms(p.firstAudio)
		r.AudioDurationS = float64(p.samples) / float64(p.rate)
		if r.AudioDurationS > 0 {
			r.AudioRTF = p.lastAudio.Seconds() / r.AudioDurationS
		}
	}
	r.Success = true
	return nil
}
