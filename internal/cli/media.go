package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/reference/mediafetch"
	"github.com/omnipd/omnipd/reference/worker"
)

// mediaFlags are the reference Thinker's media input flags, named as vLLM
// users know them (docs/multimodal/api.md): serve takes them for the
// workers it starts and passes them on.
type mediaFlags struct {
	allowedDomains   []string
	allowPrivate     bool
	allowedLocalPath string
	limitPerPrompt   string
	maxItemMB        int
}

func (m *mediaFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringSliceVar(&m.allowedDomains, "allowed-media-domains", nil, `hosts image_url, audio_url and video_url may fetch from over http(s), matched exactly, comma-separated or repeated; "*" allows any (default: none, only data: URLs and input_audio)`)
	f.BoolVar(&m.allowPrivate, "media-allow-private-networks", false, "let media URLs reach loopback and private addresses (vLLM's VLLM_MEDIA_EGRESS_BLOCK_PRIVATE=0)")
	f.StringVar(&m.allowedLocalPath, "allowed-local-media-path", "", "directory file:// media URLs may read from (default: none)")
	f.StringVar(&m.limitPerPrompt, "limit-mm-per-prompt", "", `media items per prompt by modality, as JSON: '{"image": 2, "audio": 1, "video": 1}' (default: vLLM's 999 each)`)
	f.IntVar(&m.maxItemMB, "media-max-item-mb", int(mediafetch.DefaultMaxBytes>>20), "largest media item, in MiB, whatever its source (vLLM's VLLM_MAX_AUDIO_CLIP_FILESIZE_MB)")
}

// config is the workers' MediaConfig.
func (m *mediaFlags) config() (worker.MediaConfig, error) {
	limits, err := openai.ParseMediaLimits(m.limitPerPrompt)
	if err != nil {
		return worker.MediaConfig{}, fmt.Errorf("--limit-mm-per-prompt: %w", err)
	}
	if m.maxItemMB <= 0 {
		return worker.MediaConfig{}, fmt.Errorf("--media-max-item-mb %d: want a positive size", m.maxItemMB)
	}
	p := mediafetch.Policy{
		AllowedLocalPath:     m.allowedLocalPath,
		AllowPrivateNetworks: m.allowPrivate,
		MaxRedirects:         mediafetch.VLLMMaxRedirects,
		MaxBytes:             int64(m.maxItemMB) << 20,
	}
	for _, d := range m.allowedDomains {
		if d == "*" {
			p.AllowAnyDomain = true
			continue
		}
		p.AllowedDomains = append(p.AllowedDomains, d)
	}
	// Each flag's value checked on its own, so that the error names the
	// flag to fix.
	for _, f := range []struct {
		flag string
		p    mediafetch.Policy
	}{
		{"--allowed-local-media-path", mediafetch.Policy{AllowedLocalPath: p.AllowedLocalPath}},
		{"--allowed-media-domains", mediafetch.Policy{AllowedDomains: p.AllowedDomains}},
	} {
		if _, err := mediafetch.NewFetcher(f.p); err != nil {
			return worker.MediaConfig{}, fmt.Errorf("%s: %w", f.flag, err)
		}
	}
	if _, err := mediafetch.NewFetcher(p); err != nil {
		return worker.MediaConfig{}, fmt.Errorf("media flags: %w", err)
	}
	return worker.MediaConfig{Policy: p, Limits: limits}, nil
}

// maxBodyMBUsage is the help of serve's and worker's
// --max-request-body-size-mb (llm-d's inference simulator's name for it).
const maxBodyMBUsage = "largest request body, in MiB (0: sized from --media-max-item-mb and --limit-mm-per-prompt, so that every prompt they allow fits: docs/security.md)"

// maxBodyBytes is the request body cap: mb MiB when set, else room for
// every prompt the media flags allow (openai.MaxBodyBytes).
func (m *mediaFlags) maxBodyBytes(mb int) (int64, error) {
	switch {
	case mb < 0:
		return 0, fmt.Errorf("--max-request-body-size-mb %d: want a size in MiB, or 0 to size it from the media limits", mb)
	case mb > 0:
		return int64(mb) << 20, nil
	}
	limits, err := openai.ParseMediaLimits(m.limitPerPrompt)
	if err != nil {
		return 0, fmt.Errorf("--limit-mm-per-prompt: %w", err)
	}
	return openai.MaxBodyBytes(int64(m.maxItemMB)<<20, limits), nil // 0 MiB: vLLM's default
}

// args are the flags that give a started worker the same media config.
func (m *mediaFlags) args() []string {
	var a []string
	if len(m.allowedDomains) > 0 {
		a = append(a, "--allowed-media-domains", strings.Join(m.allowedDomains, ","))
	}
	if m.allowPrivate {
		a = append(a, "--media-allow-private-networks")
	}
	if m.allowedLocalPath != "" {
		a = append(a, "--allowed-local-media-path", m.allowedLocalPath)
	}
	if m.limitPerPrompt != "" {
		a = append(a, "--limit-mm-per-prompt", m.limitPerPrompt)
	}
	if m.maxItemMB != int(mediafetch.DefaultMaxBytes>>20) {
		a = append(a, "--media-max-item-mb", strconv.Itoa(m.maxItemMB))
	}
	return a
}
