package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"

	"github.com/omnipd/omnipd/reference/engine"
	"github.com/omnipd/omnipd/reference/engine/code2wav"
	"github.com/omnipd/omnipd/reference/engine/model"
	"github.com/omnipd/omnipd/reference/engine/talker"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
	"github.com/omnipd/omnipd/reference/worker"
	"github.com/spf13/cobra"
)

func newWorkerCmd() *cobra.Command {
	var (
		host, modelDir, kvJSON, ecJSON, secret, name, stage string
		port                                                int
		ecfg                                                engine.Config
	)
	var simulateProfile string
	var maxModelLen, maxBodyMB int
	var listenFD, kvListenFD int
	var mediaOpts mediaFlags
	cmd := &cobra.Command{
		Use:   "worker [--host H] [--port N] [--model DIR] [--kv-transfer-config JSON]",
		Short: "Serve one reference engine with vLLM's OpenAI-compatible API",
		Long: `worker serves omnipd's reference Thinker engine as a stage worker, with the
API vllm serve offers: /v1/completions, /v1/chat/completions, /v1/models,
/health and /metrics. Without --model it serves the built-in tiny model, so
nothing is downloaded. --kv-transfer-config takes vLLM's JSON; with
kv_connector ReferenceConnector the worker moves KV blocks to and from other
workers over its side channel (kv_ip:kv_port). With --secret (or
OMNIPD_SECRET) every endpoint but /health and /metrics requires
"Authorization: Bearer <secret>" — what vllm serve --api-key checks — and the
side channel refuses peers that do not know it. --stage talker and --stage
code2wav serve omnipd's stage API, each with its own /metrics.

The reference engine samples plain text: a request for what it cannot honour
(tools, response_format other than text, guided decoding, logprobs, n > 1,
beam search, ...) is a 400 naming the parameter. A prompt is tokenized only
up to --max-model-len tokens; a longer one is refused with vLLM's
context-length error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if secret == "" {
				secret = os.Getenv("OMNIPD_SECRET")
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			if cmd.Flags().Changed("secret") {
				warnKeyOnCommandLine(log, "--secret", "OMNIPD_SECRET")
			}
			// Inherited sockets are taken first, so that a bad descriptor
			// fails before the model loads, and are closed on every way out
			// (a second Close, after the server's, does nothing).
			var httpLn, kvLn net.Listener
			if listenFD != 0 {
				if cmd.Flags().Changed("host") || cmd.Flags().Changed("port") {
					return errors.New("--listen-fd: the worker serves on the socket it inherits, whose address is its own; give --listen-fd or --host and --port, not both")
				}
				ln, err := inheritedListener(listenFD, "--listen-fd")
				if err != nil {
					return err
				}
				defer ln.Close()
				httpLn, host = ln, ln.Addr().(*net.TCPAddr).IP.String()
			}
			if kvListenFD != 0 {
				if stage != "thinker" {
					return fmt.Errorf("--kv-listen-fd: a %s worker has no KV side channel", stage)
				}
				ln, err := inheritedListener(kvListenFD, "--kv-listen-fd")
				if err != nil {
					return err
				}
				defer ln.Close()
				kvLn = ln
			}
			warnWorkerExposure(host, secret, log)
			switch stage {
			case "code2wav", "talker":
				sim, err := loadSimulation(simulateProfile)
				if err != nil {
					return err
				}
				var h http.Handler
				if stage == "talker" {
					ts := worker.NewTalker(talker.Default(), talker.DefaultSegmenter(), secret, log)
					if sim != nil {
						ts.Simulate(sim.Talker, nil)
					}
					h = ts
				} else {
					cs := worker.NewCode2Wav(code2wav.Default(), secret, log)
					if sim != nil {
						cs.Simulate(sim.Code2Wav, nil)
					}
					h = cs
				}
				log.Info(stage+" worker", "simulate", simulationName(sim))
				return serveHandler(cmd.Context(), httpLn, host, port, h, log, stage)
			case "thinker":
			default:
				return fmt.Errorf("--stage %q: want thinker, talker or code2wav", stage)
			}
			kv, err := worker.ParseKVTransferConfig(kvJSON)
			if err != nil {
				return err
			}
			media, err := mediaOpts.config()
			if err != nil {
				return err
			}
			maxBody, err := mediaOpts.maxBodyBytes(maxBodyMB)
			if err != nil {
				return err
			}
			ec, err := worker.ParseECTransferConfig(ecJSON)
			if err != nil {
				return err
			}
			m, tok, err := loadModel(modelDir)
			if err != nil {
				return err
			}
			if ecfg.Simulate, err = loadSimulation(simulateProfile); err != nil {
				return err
			}
			if p := ecfg.Simulate; p != nil {
				// The profile's caps model the GPU's engine; explicit flags win.
				if p.MaxNumSeqs > 0 && !cmd.Flags().Changed("max-num-seqs") {
					ecfg.MaxNumSeqs = p.MaxNumSeqs
				}
				if p.MaxNumBatchedTokens > 0 && !cmd.Flags().Changed("max-num-batched-tokens") {
					ecfg.MaxNumBatchedTokens = p.MaxNumBatchedTokens
				}
			}
			ecfg.Logger = log
			eng, err := engine.New(m, tok, ecfg)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			engineDone := make(chan struct{})
			go func() { eng.Run(ctx); close(engineDone) }()
			defer func() { cancel(); <-engineDone }()

			srv, err := worker.New(worker.Config{Engine: eng, ModelName: name, KV: kv, KVListener: kvLn, Secret: secret, MaxModelLen: maxModelLen,
				MaxBodyBytes: maxBody, Media: media, EC: ec, Logger: log})
			if err != nil {
				return err
			}
			defer srv.Close()
			log.Info("thinker worker", "kv_side_channel", srv.KVAddr(), "model", name, "simulate", simulationName(ecfg.Simulate))
			return serveHandler(ctx, httpLn, host, port, srv, log, "thinker")
		},
	}
	f := cmd.Flags()
	f.StringVar(&stage, "stage", "thinker", "which stage to serve: thinker (vLLM's API), talker or code2wav (omnipd's stage API, docs/stage-api.md)")
	f.StringVar(&host, "host", "127.0.0.1", "address to listen on")
	f.IntVar(&port, "port", 8100, "port to listen on")
	// Documented rather than hidden: they are on the command line of every
	// worker omnipd serve starts, for anyone reading ps to look up, and any
	// supervisor that binds the ports itself can use them.
	f.IntVar(&listenFD, "listen-fd", 0, "serve on the listening TCP socket inherited at this file descriptor instead of binding --host and --port: what omnipd serve passes the workers it starts, so that no other process can take a port between serve's pick and the worker")
	f.IntVar(&kvListenFD, "kv-listen-fd", 0, "serve the KV side channel (kv_producer, kv_both) on the listening TCP socket inherited at this file descriptor instead of binding kv_ip:kv_port; kv_port, if set, must be its port")
	f.StringVar(&modelDir, "model", "", "Hugging Face-format checkpoint directory (config.json, *.safetensors, tokenizer.json); empty for the built-in tiny model")
	f.StringVar(&name, "served-model-name", "omnipd-reference", "model name the API reports and accepts")
	f.StringVar(&kvJSON, "kv-transfer-config", "", "vLLM KVTransferConfig JSON; kv_connector ReferenceConnector moves KV between workers")
	f.StringVar(&ecJSON, "ec-transfer-config", "", `vLLM ECTransferConfig JSON (encoder disaggregation); ec_connector ReferenceECConnector: ec_role ec_producer encodes media items and keeps their outputs, ec_consumer (a prefill) fetches them instead of encoding`)
	f.StringVar(&secret, "secret", "", "deployment secret every endpoint but /health and /metrics and the KV side channel require (default $OMNIPD_SECRET)")
	f.IntVar(&maxModelLen, "max-model-len", 0, "longest prompt plus output, in tokens (0: the model's max_position_embeddings)")
	f.IntVar(&maxBodyMB, "max-request-body-size-mb", 0, maxBodyMBUsage)
	f.IntVar(&ecfg.BlockSize, "block-size", 16, "token positions per KV block")
	f.IntVar(&ecfg.NumBlocks, "num-blocks", 4096, "KV cache size in blocks")
	f.IntVar(&ecfg.MaxNumSeqs, "max-num-seqs", 64, "sequences computed in one step")
	f.IntVar(&ecfg.MaxNumBatchedTokens, "max-num-batched-tokens", 2048, "tokens computed in one step")
	f.StringVar(&simulateProfile, "simulate", "", simulateUsage("the stage"))
	mediaOpts.register(cmd)
	return cmd
}

// loadModel loads a checkpoint directory, or the built-in model when dir is empty.
func loadModel(dir string) (*model.Model, *tokenizer.Tokenizer, error) {
	if dir == "" {
		return model.Default(), tokenizer.Default(), nil
	}
	m, err := model.Load(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("load model: %w", err)
	}
	tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, nil, fmt.Errorf("load tokenizer: %w", err)
	}
	if tok.VocabSize() > m.Config.VocabSize {
		return nil, nil, fmt.Errorf("the tokenizer has %d tokens, the model's vocabulary %d", tok.VocabSize(), m.Config.VocabSize)
	}
	return m, tok, nil
}

// warnWorkerExposure says who can use a worker that has no secret: anyone
// who can reach it can run its engine, read its conditioning and start KV
// transfers — other users of this host on loopback, anyone on the network
// beyond it.
func warnWorkerExposure(host, secret string, log *slog.Logger) {
	if secret != "" {
		return
	}
	who := "any process on this host"
	if !isLoopback(host) {
		who = "anyone who can reach this host (listening on " + host + ")"
	}
	log.Warn("no deployment secret: " + who + " can use this worker (run its engine, read its conditioning, start KV transfers); set --secret or OMNIPD_SECRET")
}
