package server

import (
	"context"
	"strings"
	"testing"

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
