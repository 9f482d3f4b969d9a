package server

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/audio"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// The official OpenAI Go client streams a reply through omnipd's PD path.
func TestOfficialClientStreams(t *testing.T) {
	pd := pdDeployment(t, "push", 1)
	client := openai.NewClient(option.WithBaseURL(pd.url+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:     "omnipd-reference",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say something.")},
		MaxTokens: openai.Int(8),
		Seed:      openai.Int(7),
	})
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks < 2 || len(acc.Choices) != 1 || acc.Choices[0].FinishReason != "length" {
		t.Fatalf("accumulated %d chunks into %+v", chunks, acc.Choices)
	}
	if strings.TrimSpace(acc.ID) == "" {
		t.Error("no completion id")
	}

	resp, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:     "omnipd-reference",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say something.")},
		MaxTokens: openai.Int(8),
		Seed:      openai.Int(7),
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Message.Content != acc.Choices[0].Message.Content {
		t.Errorf("streamed %q, whole %q", acc.Choices[0].Message.Content, resp.Choices[0].Message.Content)
	}
	if resp.Usage.PromptTokensDetails.CachedTokens != resp.Usage.PromptTokens-1 {
		t.Errorf("usage %+v: the decode should report every prompt token but one as cached", resp.Usage)
	}
}

// The WAV the official client receives is a real file: RIFF, 24 kHz, mono,
// 16-bit, whole 80 ms codec frames long.
func TestOfficialClientReceivesWAV(t *testing.T) {
	d := newOmniDeployment(t, true)
	client := openai.NewClient(option.WithBaseURL(d.url+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	resp, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:      "omnipd-reference",
		Messages:   []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello.")},
		MaxTokens:  openai.Int(6),
		Modalities: []string{"text", "audio"},
		Audio:      openai.ChatCompletionAudioParam{Format: openai.ChatCompletionAudioParamFormatWAV, Voice: openai.ChatCompletionAudioParamVoiceUnion{OfString: openai.String("alloy")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var wav []byte
	for _, c := range resp.Choices {
		if c.Message.Audio.Data != "" {
			wav, err = base64.StdEncoding.DecodeString(c.Message.Audio.Data)
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(wav) < 44 || string(wav[:4]) != "RIFF" || string(wav[8:12]) != "WAVE" {
		t.Fatalf("not a RIFF/WAVE file: %d bytes", len(wav))
	}
	samples, rate, channels, err := audio.DecodeWAV(wav)
	if err != nil || rate != 24000 || channels != 1 || binary.LittleEndian.Uint16(wav[34:36]) != 16 {
		t.Fatalf("WAV %v: %d Hz, %d channels, %d bits", err, rate, channels, binary.LittleEndian.Uint16(wav[34:36]))
	}
	if frames := len(samples) / audio.SamplesPerFrame; frames == 0 || len(samples)%audio.SamplesPerFrame != 0 {
		t.Errorf("%d samples: want a whole number of 80 ms frames (1920 samples each)", len(samples))
	}
}

// The official client sends input_audio and image_url parts: the reference
// Thinker hears and sees them under PD and answers as colocated does.
func TestOfficialClientSendsMedia(t *testing.T) {
	colocated := newOmniDeploymentFull(t, false, func(*httptest.Server) {}, 0)
	pd := newOmniDeploymentFull(t, true, func(*httptest.Server) {}, 0)
	parts := []openai.ChatCompletionContentPartUnionParam{
		openai.InputAudioContentPart(openai.ChatCompletionContentPartInputAudioInputAudioParam{Data: base64.StdEncoding.EncodeToString(testWAV(t, 0.8, 16000, 330)), Format: "wav"}),
		openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: dataURL("image/png", testPNG(t, 48, 40))}),
		openai.TextContentPart("What do you hear and see?"),
	}
	answer := func(url string) string {
		client := openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
		resp, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
			Model:       "omnipd-reference",
			Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage(parts)},
			MaxTokens:   openai.Int(8),
			Temperature: openai.Float(0),
			Modalities:  []string{"text"},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" {
			t.Fatalf("answer %+v", resp.Choices)
		}
		return resp.Choices[0].Message.Content
	}
	if got, want := answer(pd.url), answer(colocated.url); got != want {
		t.Errorf("PD %q; colocated %q", got, want)
	}
}
