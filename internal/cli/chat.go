package cli

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/omnipd/omnipd/openai"
	"github.com/spf13/cobra"
)

func newChatCmd() *cobra.Command {
	var (
		url, audioPath, apiKey string
		maxTokens              int
	)
	cmd := &cobra.Command{
		Use:   `chat [--url URL] [--audio out.wav] "prompt"`,
		Short: "Ask a running omnipd a question; print the text, write the audio",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("api-key") {
				apiKey = os.Getenv("OMNIPD_API_KEY")
			}
			req := map[string]any{
				"messages":   []map[string]string{{"role": "user", "content": args[0]}},
				"max_tokens": maxTokens,
				"modalities": []string{"text"},
			}
			if audioPath != "" {
				req["modalities"] = []string{"text", "audio"}
				req["audio"] = map[string]string{"format": "wav"}
			}
			body, _ := json.Marshal(req)
			hreq, err := http.NewRequestWithContext(cmd.Context(), http.MethodPost, strings.TrimRight(url, "/")+"/v1/chat/completions", bytes.NewReader(body))
			if err != nil {
				return err
			}
			hreq.Header.Set("Content-Type", "application/json")
			if apiKey != "" {
				hreq.Header.Set("Authorization", "Bearer "+apiKey)
			}
			resp, err := (&http.Client{Timeout: 10 * time.Minute}).Do(hreq)
			if err != nil {
				return fmt.Errorf("is omnipd serve running at %s? %w", url, err)
			}
			defer resp.Body.Close()
			raw, err := io.ReadAll(resp.Body)
			if err != nil {
				return err
			}
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("HTTP %d: %s", resp.StatusCode, printable(string(bytes.TrimSpace(raw))))
			}
			var out openai.ChatCompletion
			if err := json.Unmarshal(raw, &out); err != nil {
				return fmt.Errorf("the answer is not a chat completion: %w", err)
			}
			wrote := false
			for _, c := range out.Choices {
				if c.Message.Content != nil {
					fmt.Fprintln(cmd.OutOrStdout(), printable(*c.Message.Content))
				}
				if c.Message.Audio != nil && audioPath != "" {
					wav, err := base64.StdEncoding.DecodeString(c.Message.Audio.Data)
					if err != nil {
						return fmt.Errorf("the audio is not base64: %w", err)
					}
					if err := os.WriteFile(audioPath, wav, 0o644); err != nil {
						return err
					}
					fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s (%d bytes)\n", audioPath, len(wav))
					wrote = true
				}
			}
			if audioPath != "" && !wrote {
				return fmt.Errorf("the answer has no audio (is the pipeline text-only?)")
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&url, "url", "http://127.0.0.1:8000", "omnipd's base URL")
	f.StringVar(&audioPath, "audio", "", "write the spoken answer to this WAV file")
	f.IntVar(&maxTokens, "max-tokens", 64, "the longest answer, in tokens")
	// No default from the environment: cobra prints defaults in its usage
	// text, and a key must never be printed.
	f.StringVar(&apiKey, "api-key", "", "API key, if the server requires one (default $OMNIPD_API_KEY; the flag wins)")
	return cmd
}

// printable is s with every rune a terminal might act on, rather than show,
// written as its Go escape (\x1b, \a, \r, \u202e): C0 and C1 controls
// other than newline and tab, DEL, and the invisible format characters
// (bidirectional overrides, zero-width joiners), as unicode.IsPrint sees
// them. Invalid UTF-8 shows as \xNN too. A model's text can hold any of
// these — the reference model's random tokens often do — and printed raw
// they clear the screen, retitle the window or reorder what the reader sees.
// chat escapes always, not only on a terminal: it is a tool for people, and
// a program that wants the exact text reads the API's JSON.
func printable(s string) string {
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case r == unicode.ReplacementChar && !strings.HasPrefix(s[i:], "\uFFFD"):
			fmt.Fprintf(&b, "\\x%02x", s[i])
		case !unicode.IsPrint(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
