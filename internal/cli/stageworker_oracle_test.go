package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/orchestrator"
	"github.com/omnipd/omnipd/vllmplan"
)

// omnipd's invariant on the vllm-omni stage worker path, taken as an
// operator takes it (plan, the script it writes, the serve it prints): a
// spoken pipeline planned with --pd on NIXL (four stage workers) answers
// exactly what the same pipeline planned colocated (three) answers — the
// text, and the audio sample for sample — greedy and seeded, whole
// and streamed, with the fixture's async chunk on and, through a config
// overlay, off; and within one deployment the whole answer's audio is the
// streamed answer's. The PD answers must have gone disaggregated (the path
// header, and the decode's cached_tokens = prompt − 1), so that the
// comparison cannot pass by PD falling back to one Thinker.
//
// The workers run omnipd's stage worker on its stand-in for vllm-omni, as
// TestPlannedStageWorkersServeASpokenAnswer runs them; each deployment gets
// one omnipd serve per async-chunk setting, in front of the same workers.
func TestStageWorkersPDAnswersEqualColocated(t *testing.T) {
	t.Setenv("OMNIPD_SECRET", "")
	t.Setenv("OMNIPD_API_KEY", "")
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fixture := filepath.Join(repo, "deploy/testdata/fixtures/vllm-omni/qwen3_omni_moe.yaml")

	// Free ports for NIXL's side channels, which the plan also checks
	// against the instances' HTTP ports.
	pdDir := t.TempDir()
	pdConfig := filepath.Join(pdDir, "deploy.yaml")
	if err := os.WriteFile(pdConfig, fmt.Appendf(nil, "base_config: %s\npd:\n  connector: NixlConnector\n  prefill:\n    kv_port: %d\n  decode:\n    kv_port: %d\n",
		fixture, freePort(t), freePort(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	// One deployment after the other: each takes its ports only once the
	// other's workers hold theirs.
	pd := launchOracleDeployment(t, repo, pdDir, pdConfig, configFlags{pd: true, connector: kvconnector.NixlConnector}, 4)
	co := launchOracleDeployment(t, repo, t.TempDir(), fixture, configFlags{}, 3)

	// The Talker samples at its own temperature (the fixture's 0.9), not
	// the request's: only the request's seed, which reaches the Talker,
	// makes the audio of a greedy answer repeatable. The Thinker at
	// temperature 0 ignores the seed.
	cases := []struct{ name, body string }{
		{"greedy", `{"model":"standin-model","messages":[{"role":"user","content":"Hello!"}],` +
			`"modalities":["text","audio"],"max_tokens":8,"temperature":0,"seed":2026}`},
		// A longer conversation: a prompt of more than one KV block, and
		// more than one user turn for the Talker's prompt.
		{"seeded", `{"model":"standin-model","messages":[{"role":"system","content":"You are a helpful voice."},` +
			`{"role":"user","content":"What is the capital of France?"},{"role":"assistant","content":"Paris."},` +
			`{"role":"user","content":"And of Italy?"}],"modalities":["text","audio"],"max_tokens":8,"temperature":0.8,"seed":7}`},
	}

	// answers[deployment][async][case][whole, streamed]
	answers := map[string]map[bool]map[string][2]spokenAnswer{}
	chunked := false
	for _, d := range []*oracleDeployment{pd, co} {
		answers[d.name] = map[bool]map[string][2]spokenAnswer{}
		for _, async := range []bool{true, false} {
			at := fmt.Sprintf("%s, async_chunk %v", d.name, async)
			reads := talkerStreamedReads(t, d.talker)
			byCase := map[string][2]spokenAnswer{}
			for _, c := range cases {
				whole := askWhole(t, d.serve[async], c.body)
				streamed := askStreamed(t, d.serve[async], c.body)
				for i, a := range []spokenAnswer{whole, streamed} {
					what := fmt.Sprintf("%s, %s, %s", at, c.name, [2]string{"whole", "streamed"}[i])
					wantSpoken(t, what, a)
					if d.pd {
						wantDisaggregated(t, what, a)
					} else if a.path != orchestrator.PathColocated {
						t.Errorf("%s: X-Omnipd-Pd-Path %q, want %q", what, a.path, orchestrator.PathColocated)
					}
				}
				chunked = chunked || streamed.chunks > 1
				if diff := diffSpoken(streamed, whole); diff != "" {
					t.Errorf("%s, %s: the streamed answer differs from the whole one: %s", at, c.name, diff)
				}
				byCase[c.name] = [2]spokenAnswer{whole, streamed}
			}
			// The overlay must really turn async chunk off: the Talker
			// streams its conditioning reads (?from=N) only under it.
			n := talkerStreamedReads(t, d.talker) - reads
			if async && n < 2*len(cases) {
				t.Errorf("%s: the Talker made %d streamed conditioning reads for %d requests; want at least one each", at, n, 2*len(cases))
			}
			if !async && n != 0 {
				t.Errorf("%s: the Talker made %d streamed conditioning reads; want none with async chunk off", at, n)
			}
			answers[d.name][async] = byCase
		}
	}
	if !chunked {
		t.Errorf("no streamed answer came in more than one audio chunk; the concatenation of chunks went untested")
	}

	for _, c := range cases {
		for _, async := range []bool{true, false} {
			for i, how := range []string{"whole", "streamed"} {
				got, want := answers[pd.name][async][c.name][i], answers[co.name][async][c.name][i]
				if diff := diffSpoken(got, want); diff != "" {
					t.Errorf("%s, async_chunk %v, %s: PD differs from colocated: %s", c.name, async, how, diff)
				}
				if got.promptTokens != want.promptTokens || got.completionTokens != want.completionTokens {
					t.Errorf("%s, async_chunk %v, %s: PD counts %d prompt and %d completion tokens, colocated %d and %d",
						c.name, async, how, got.promptTokens, got.completionTokens, want.promptTokens, want.completionTokens)
				}
			}
		}
		// Async chunk changes timing, never values.
		if diff := diffSpoken(answers[co.name][false][c.name][0], answers[co.name][true][c.name][0]); diff != "" {
			t.Errorf("%s, colocated, whole: async_chunk false differs from true: %s", c.name, diff)
		}
	}
}

// oracleDeployment is one planned pipeline on stage workers, with an
// omnipd serve in front of it for each async-chunk setting.
type oracleDeployment struct {
	name   string
	pd     bool
	serve  map[bool]*oracleServe // by async_chunk
	talker string                // the Talker worker's URL
}

// oracleServe is one omnipd serve of a deployment, and where to look when
// an answer fails: serve's log and its workers' logs in dir.
type oracleServe struct {
	url  string
	logs *lockedBuffer
	dir  string
}

// diagnostics is serve's log and the end of each worker's.
func (s *oracleServe) diagnostics() string {
	var b strings.Builder
	fmt.Fprintf(&b, "serve:\n%s", s.logs.String())
	logs, _ := filepath.Glob(filepath.Join(s.dir, "*.log"))
	for _, l := range logs {
		text, _ := os.ReadFile(l)
		lines := strings.Split(strings.TrimSpace(string(text)), "\n")
		fmt.Fprintf(&b, "%s:\n%s\n", filepath.Base(l), strings.Join(lines[max(0, len(lines)-20):], "\n"))
	}
	return b.String()
}

// launchOracleDeployment plans config for n stage workers on the stand-in
// and runs the script as an operator does, then starts the serve command
// it prints; and plans config under an overlay setting async_chunk: false,
// serving that plan's omnipd config in front of the same workers.
func launchOracleDeployment(t *testing.T, repo, dir, config string, flags configFlags, n int) *oracleDeployment {
	t.Helper()
	d := &oracleDeployment{name: "colocated", pd: flags.pd, serve: map[bool]*oracleServe{}}
	if d.pd {
		d.name = "PD"
	}
	overlay := filepath.Join(dir, "no-async-chunk.yaml")
	if err := os.WriteFile(overlay, fmt.Appendf(nil, "base_config: %s\nasync_chunk: false\n", config), 0o600); err != nil {
		t.Fatal(err)
	}
	base := freePortRunCLI(t, n)
	opts := vllmplan.VLLMOptions{Model: "standin-model", BasePort: base}
	var script, overlaid, errOut bytes.Buffer
	if err := runPlan(config, flags, opts, &script, &errOut); err != nil {
		t.Fatalf("plan %s: %v\n%s", config, err, errOut.String())
	}
	if err := runPlan(overlay, flags, opts, &overlaid, &errOut); err != nil {
		t.Fatalf("plan %s: %v\n%s", overlay, err, errOut.String())
	}
	// The workers take async chunk per request (the Talker leg says it),
	// so one set of them serves both settings — as long as the two plans
	// start the same workers, which differ at most in their deploy
	// config's async_chunk line.
	const on, off = "\nasync_chunk: true\n", "\nasync_chunk: false\n"
	if strings.Count(script.String(), on) != 2 || strings.ReplaceAll(overlaid.String(), off, on) != script.String() {
		t.Fatalf("the plan of %s differs from the plan of %s in more than its two async_chunk lines:\n%s", overlay, config, overlaid.String())
	}
	if got := strings.Count(script.String(), "\npython3 -m omnipd_stage "); got != n {
		t.Fatalf("the plan of %s starts %d stage workers, want %d:\n%s", config, got, n, script.String())
	}
	m := regexp.MustCompile(`(?m)^# talker-0: stage \d+ \(\w+\), replica 0 -> (\S+)$`).FindStringSubmatch(script.String())
	if m == nil {
		t.Fatalf("the plan starts no talker-0:\n%s", script.String())
	}
	d.talker = m[1]

	line := runLaunchScript(t, repo, dir, script.Bytes(), base, n)
	fields := strings.Fields(line)
	if len(fields) < 2 || fields[0] != "omnipd" || fields[1] != "serve" {
		t.Fatalf("launch.sh printed %q to run next", line)
	}
	p := plannedServe{dir: dir}
	for i := 1; i < len(fields); i++ {
		p.args = append(p.args, fields[i])
		if (fields[i] == "--config" || fields[i] == "--secret-file") && i+1 < len(fields) {
			p.args = append(p.args, filepath.Join(dir, fields[i+1]))
			i++
		}
	}
	url, logs := p.start(t)
	d.serve[true] = &oracleServe{url: url, logs: logs, dir: dir}

	cfg, ok := heredoc(overlaid.String(), vllmplan.VLLMConfigFile)
	if !ok {
		t.Fatalf("the plan of %s writes no %s", overlay, vllmplan.VLLMConfigFile)
	}
	q := plannedServe{dir: dir, cfg: cfg}
	path := filepath.Join(dir, "no-async-chunk-"+vllmplan.VLLMConfigFile)
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(p.args); i++ {
		q.args = append(q.args, p.args[i])
		if p.args[i] == "--config" {
			q.args = append(q.args, path)
			i++
		}
	}
	url, logs = q.start(t)
	d.serve[false] = &oracleServe{url: url, logs: logs, dir: dir}
	return d
}

// runLaunchScript runs a plan's script in dir with the stand-in for
// vllm-omni on its python3's path, until every instance is ready, and
// returns the command it prints to run next. The script and its n workers
// on ports base.. are stopped when the test ends.
func runLaunchScript(t *testing.T, repo, dir string, script []byte, base, n int) string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "launch.sh"), script, 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(stageWorkerPython(t), filepath.Join(bin, "python3")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "launch.sh")
	cmd.Dir = dir
	cmd.Env = []string{"HOME=" + dir, "PATH=" + bin + ":/usr/bin:/bin", "PYTHONUNBUFFERED=1",
		"PYTHONPATH=" + filepath.Join(repo, "vllm-omni-stage", "standin")}
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
		}
		// The script stops its workers as it ends; they are gone once
		// their ports refuse connections.
		for i := range n {
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
				c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", base+i))
				if err != nil {
					break
				}
				c.Close()
				if time.Now().After(deadline) {
					t.Errorf("the stage worker on port %d outlived launch.sh", base+i)
					break
				}
			}
		}
	})
	for deadline := time.Now().Add(3 * time.Minute); !strings.Contains(out.String(), "every instance is ready"); time.Sleep(50 * time.Millisecond) {
		select {
		case <-exited:
			t.Fatalf("launch.sh exited:\n%s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stage workers are not ready:\n%s", out.String())
		}
	}
	_, next, _ := strings.Cut(out.String(), "Next, in another terminal:\n")
	line, _, _ := strings.Cut(strings.TrimSpace(next), "\n")
	return line
}

// spokenAnswer is what a client takes from a chat answer with text and
// audio: the text, and the audio as the 16-bit PCM of its WAV data.
type spokenAnswer struct {
	text   string
	pcm    []byte
	chunks int // audio chunks of a streamed answer
	path   string
	// usage; cachedTokens is -1 when the answer has no prompt_tokens_details
	promptTokens, completionTokens, cachedTokens int
}

// oracleClient bounds a request only where a hang would reach.
var oracleClient = &http.Client{Timeout: 2 * time.Minute}

func postChat(t *testing.T, s *oracleServe, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := oracleClient.Do(req)
	if err != nil {
		t.Fatalf("chat %s: %v\n%s", body, err, s.diagnostics())
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := readOracleBody(resp)
		t.Fatalf("chat %s: %d %.600s\n%s", body, resp.StatusCode, b, s.diagnostics())
	}
	return resp
}

func readOracleBody(resp *http.Response) ([]byte, error) {
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err := b.ReadFrom(resp.Body)
	return b.Bytes(), err
}

type oracleUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (a *spokenAnswer) setUsage(u *oracleUsage) {
	a.promptTokens, a.completionTokens, a.cachedTokens = u.PromptTokens, u.CompletionTokens, -1
	if u.PromptTokensDetails != nil {
		a.cachedTokens = u.PromptTokensDetails.CachedTokens
	}
}

// askWhole sends body as it is: one JSON answer, whose text choice and
// audio choice (a whole WAV) it returns.
func askWhole(t *testing.T, s *oracleServe, body string) spokenAnswer {
	t.Helper()
	resp := postChat(t, s, body)
	b, err := readOracleBody(resp)
	if err != nil {
		t.Fatalf("chat %s: reading the answer: %v", body, err)
	}
	var answer struct {
		Choices []struct {
			Message struct {
				Content *string `json:"content"`
				Audio   *struct {
					Data string `json:"data"`
				} `json:"audio"`
			} `json:"message"`
		} `json:"choices"`
		Usage *oracleUsage `json:"usage"`
	}
	if err := json.Unmarshal(b, &answer); err != nil || answer.Usage == nil {
		t.Fatalf("chat %s: an answer without usage, or not JSON (%v):\n%.600s", body, err, b)
	}
	a := spokenAnswer{path: resp.Header.Get("X-Omnipd-Pd-Path")}
	a.setUsage(answer.Usage)
	var texts, wavs int
	for _, c := range answer.Choices {
		if c.Message.Content != nil {
			texts++
			a.text = *c.Message.Content
		}
		if c.Message.Audio != nil {
			wavs++
			if a.pcm, err = wavPCM(c.Message.Audio.Data); err != nil {
				t.Fatalf("chat %s: the audio choice: %v", body, err)
			}
		}
	}
	if texts != 1 || wavs != 1 {
		t.Fatalf("chat %s: %d text and %d audio choices, want one each:\n%.600s", body, texts, wavs, b)
	}
	return a
}

// askStreamed sends body with stream (and the usage chunk) on: the text
// deltas joined, and the PCM of each audio chunk's WAV, in order.
func askStreamed(t *testing.T, s *oracleServe, body string) spokenAnswer {
	t.Helper()
	body = strings.TrimSuffix(strings.TrimSpace(body), "}") + `,"stream":true,"stream_options":{"include_usage":true}}`
	resp := postChat(t, s, body)
	defer resp.Body.Close()
	a := spokenAnswer{path: resp.Header.Get("X-Omnipd-Pd-Path"), cachedTokens: -1}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	done, usage := false, false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var chunk struct {
			Modality string `json:"modality"`
			Choices  []struct {
				Delta struct {
					Content *string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *oracleUsage    `json:"usage"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil || chunk.Error != nil {
			t.Fatalf("chat %s: event %.600s (%v)\n%s", body, data, err, s.diagnostics())
		}
		if chunk.Usage != nil {
			usage = true
			a.setUsage(chunk.Usage)
		}
		for _, c := range chunk.Choices {
			if c.Delta.Content == nil {
				continue
			}
			switch chunk.Modality {
			case "text":
				a.text += *c.Delta.Content
			case "audio":
				pcm, err := wavPCM(*c.Delta.Content)
				if err != nil {
					t.Fatalf("chat %s: audio chunk %d: %v", body, a.chunks, err)
				}
				a.pcm = append(a.pcm, pcm...)
				a.chunks++
			default:
				t.Fatalf("chat %s: an event of modality %q: %.600s", body, chunk.Modality, data)
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("chat %s: reading the stream: %v", body, err)
	}
	if !done || !usage {
		t.Fatalf("chat %s: the stream ended without [DONE] (%v) or without its usage chunk (%v)", body, done, usage)
	}
	return a
}

// wavPCM decodes the base64 of a WAV file and returns its data chunk, after
// checking that it holds what omnipd's audio is: 16-bit PCM, mono, 24 kHz.
// It reads the container itself, so that the comparison does not rest on
// omnipd's own decoder.
func wavPCM(b64 string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("not base64: %w", err)
	}
	if len(b) < 12 || string(b[:4]) != "RIFF" || string(b[8:12]) != "WAVE" {
		return nil, errors.New("not a RIFF WAVE file")
	}
	var fmtOK bool
	for rest := b[12:]; len(rest) >= 8; {
		id, size := string(rest[:4]), int(binary.LittleEndian.Uint32(rest[4:8]))
		if size > len(rest)-8 {
			return nil, fmt.Errorf("chunk %q of %d bytes in %d", id, size, len(rest)-8)
		}
		body := rest[8 : 8+size]
		switch id {
		case "fmt ":
			if size < 16 {
				return nil, fmt.Errorf("fmt chunk of %d bytes", size)
			}
			format, channels := binary.LittleEndian.Uint16(body), binary.LittleEndian.Uint16(body[2:])
			rate, bits := binary.LittleEndian.Uint32(body[4:]), binary.LittleEndian.Uint16(body[14:])
			if format != 1 || channels != 1 || rate != 24000 || bits != 16 {
				return nil, fmt.Errorf("format %d, %d channels, %d Hz, %d bits; want PCM (1), mono, 24000 Hz, 16 bits", format, channels, rate, bits)
			}
			fmtOK = true
		case "data":
			if !fmtOK {
				return nil, errors.New("data before fmt")
			}
			if size%2 != 0 {
				return nil, fmt.Errorf("%d data bytes: not whole 16-bit samples", size)
			}
			return body, nil
		}
		rest = rest[8+size+size%2:]
	}
	return nil, errors.New("no data chunk")
}

// wantSpoken fails t unless a has text and audio that is not silence: two
// empty answers would compare equal.
func wantSpoken(t *testing.T, what string, a spokenAnswer) {
	t.Helper()
	if a.text == "" {
		t.Errorf("%s: no text", what)
	}
	if !nonSilent(a.pcm) {
		t.Errorf("%s: %d bytes of audio, all silence; want speech", what, len(a.pcm))
	}
}

func nonSilent(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return true
		}
	}
	return false
}

// wantDisaggregated fails t unless a went through the prefill and a decode
// that imported the prompt's KV: it computed only the prompt's last token.
func wantDisaggregated(t *testing.T, what string, a spokenAnswer) {
	t.Helper()
	if a.path != orchestrator.PathDisaggregated {
		t.Errorf("%s: X-Omnipd-Pd-Path %q, want %q", what, a.path, orchestrator.PathDisaggregated)
	}
	if a.promptTokens < 2 || a.cachedTokens != a.promptTokens-1 {
		t.Errorf("%s: cached_tokens %d of %d prompt tokens, want prompt tokens − 1", what, a.cachedTokens, a.promptTokens)
	}
}

// diffSpoken says how got differs from want, or "" when the text and every
// sample are equal; the first differing sample is named by its index.
func diffSpoken(got, want spokenAnswer) string {
	var diffs []string
	if got.text != want.text {
		diffs = append(diffs, fmt.Sprintf("text %q, want %q", got.text, want.text))
	}
	if !bytes.Equal(got.pcm, want.pcm) {
		n := min(len(got.pcm), len(want.pcm)) / 2
		i := 0
		for i < n && got.pcm[2*i] == want.pcm[2*i] && got.pcm[2*i+1] == want.pcm[2*i+1] {
			i++
		}
		d := fmt.Sprintf("audio of %d samples, want %d; first differing sample %d", len(got.pcm)/2, len(want.pcm)/2, i)
		if i < n {
			d += fmt.Sprintf(": %d, want %d", sample(got.pcm, i), sample(want.pcm, i))
		}
		diffs = append(diffs, d)
	}
	return strings.Join(diffs, "; ")
}

func sample(pcm []byte, i int) int16 { return int16(binary.LittleEndian.Uint16(pcm[2*i:])) }

// talkerStreamedReads is the Talker worker's count of conditioning reads
// it streamed (?from=N), which it makes only for async-chunk requests.
func talkerStreamedReads(t *testing.T, url string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := oracleClient.Do(req)
	if err != nil {
		t.Fatalf("the Talker's /metrics: %v", err)
	}
	b, err := readOracleBody(resp)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the Talker's /metrics: %d %v", resp.StatusCode, err)
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "omnipd_talker_conditioning_reads_total{"); ok {
			_, v, _ := strings.Cut(rest, "} ")
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("the Talker's /metrics: %q: %v", line, err)
			}
			return int(n)
		}
	}
	t.Fatalf("the Talker's /metrics has no omnipd_talker_conditioning_reads_total:\n%s", b)
	return 0
}
