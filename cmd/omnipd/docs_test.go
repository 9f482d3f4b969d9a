package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The shell blocks of README.md and docs/ are commands a reader pastes:
// each must parse, and each runs as written unless the line before it says
// why it cannot run here:
//
//	<!-- doc-test: skip: it starts vllm serve on GPUs -->
//
// A block after <!-- doc-test: serve --> talks to a running omnipd: it runs
// beside `omnipd serve` on the default port.

// repoRoot is the repository, seen from this package's directory.
const repoRoot = "../.."

// docBlockBound bounds one block's run: a block that takes longer is stuck.
const docBlockBound = 10 * time.Minute

// shellBlock is one ```sh block of a Markdown file.
type shellBlock struct {
	file string // relative to the repository root
	line int    // of its opening fence
	// mode is "run", "serve" (run beside omnipd serve) or "skip" (parse only,
	// for the reason why).
	mode, why string
	text      string
}

func (b shellBlock) String() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

var (
	fenceOpen   = regexp.MustCompile("^(\\s*)```(\\w*)\\s*$")
	fenceClose  = regexp.MustCompile("^\\s*```\\s*$")
	docTestNote = regexp.MustCompile(`^<!-- doc-test: (serve|skip: (.+)) -->$`)
	shellInfo   = map[string]bool{"sh": true, "bash": true, "shell": true}
)

// docFiles lists README.md and every Markdown file under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(repoRoot, "docs"), func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, _ := filepath.Rel(repoRoot, path)
			files = append(files, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// shellBlocks reads the shell blocks of the docs, in file order.
func shellBlocks(t *testing.T) []shellBlock {
	t.Helper()
	var blocks []shellBlock
	for _, file := range docFiles(t) {
		raw, err := os.ReadFile(filepath.Join(repoRoot, file))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(raw), "\n")
		for i := 0; i < len(lines); i++ {
			m := fenceOpen.FindStringSubmatch(lines[i])
			if m == nil {
				continue
			}
			start, indent := i, m[1]
			var body []string
			for i++; i < len(lines) && !fenceClose.MatchString(lines[i]); i++ {
				body = append(body, strings.TrimPrefix(lines[i], indent))
			}
			if !shellInfo[m[2]] {
				continue
			}
			b := shellBlock{file: file, line: start + 1, mode: "run", text: strings.Join(body, "\n") + "\n"}
			if prev := previousLine(lines, start); prev != "" {
				if n := docTestNote.FindStringSubmatch(prev); n != nil {
					b.mode, b.why = n[1], n[2]
					if b.why != "" {
						b.mode = "skip"
					}
				} else if strings.HasPrefix(prev, "<!-- doc-test") {
					t.Errorf("%s:%d: %q: want <!-- doc-test: serve --> or <!-- doc-test: skip: WHY -->", file, start, prev)
				}
			}
			blocks = append(blocks, b)
		}
	}
	return blocks
}

// previousLine is the last non-empty line before line i.
func previousLine(lines []string, i int) string {
	for j := i - 1; j >= 0; j-- {
		if s := strings.TrimSpace(lines[j]); s != "" {
			return s
		}
	}
	return ""
}

// Every shell block of the docs parses: a reader can paste it and get the
// commands it shows, not a shell waiting at ">" for a quote to close.
func TestDocShellBlocksParse(t *testing.T) {
	blocks := shellBlocks(t)
	if len(blocks) < 10 {
		t.Fatalf("found %d shell blocks in README.md and docs/; the reader is looking elsewhere", len(blocks))
	}
	for _, b := range blocks {
		cmd := exec.Command("bash", "-n")
		cmd.Stdin = strings.NewReader(b.text)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: the block does not parse (%v): %s\n%s", b, err, out, b.text)
		}
	}
}

// The README's first screen says what omnipd is, gives the two commands
// and one request, and points onward; no line of it is wider than a
// terminal shows.
func TestREADMEFirstScreen(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	screen := strings.Join(lines[:min(len(lines), 40)], "\n")
	for _, want := range []string{"go run ./cmd/omnipd serve", "./scripts/test.sh", "curl -s localhost:8000/v1/chat/completions"} {
		if !strings.Contains(screen, want) {
			t.Errorf("the README's first 40 lines lack %q", want)
		}
	}
	for i, l := range lines {
		if !strings.HasPrefix(l, "|") && len([]rune(l)) > 120 {
			t.Errorf("README.md:%d is %d characters wide; keep prose within 120", i+1, len([]rune(l)))
		}
	}
}

// Every shell block of the docs that can run here runs as written, and
// succeeds: in file order, in one directory that sees the repository
// (files a block writes stay for the next, as they would for a reader
// following along), each block in network and process namespaces of its
// own — port 8000 is free there, and nothing it starts outlives it — with
// the built omnipd on PATH and as ./omnipd.
func TestDocShellBlocksRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs the docs' commands")
	}
	isolate := namespaces(t)
	for _, tool := range []string{"bash", "curl", "python3", "base64"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the docs' commands need %s: %v", tool, err)
		}
	}
	dir := docDir(t)
	for _, b := range shellBlocks(t) {
		if b.mode == "skip" {
			t.Logf("%s: not run here: %s", b, b.why)
			continue
		}
		t.Run(b.String(), func(t *testing.T) { runBlock(t, isolate, dir, b) })
	}
}

// namespaces is the unshare command line that gives a block network and
// process namespaces of its own, or fails t saying why there are none.
func namespaces(t *testing.T) []string {
	t.Helper()
	// A /proc of the new process namespace, so that a worker's shared
	// memory (which a peer opens by its /proc/PID/fd) is found there.
	args := []string{"unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"}
	if os.Geteuid() != 0 {
		args = append(args[:1], append([]string{"--user", "--map-root-user"}, args[1:]...)...)
	}
	probe := exec.Command(args[0], append(args[1:], "true")...)
	if out, err := probe.CombinedOutput(); err != nil {
		t.Fatalf("the docs' commands run in namespaces of their own (%s): %v %s", strings.Join(args, " "), err, out)
	}
	return args
}

// docDir is a directory whose entries are the repository's, and which holds
// the built omnipd as ./omnipd and in .bin, first on the blocks' PATH.
func docDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	entries, err := os.ReadDir(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == ".git" {
			continue
		}
		if err := os.Symlink(filepath.Join(root, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	bin := buildBinary(t)
	if err := os.Mkdir(filepath.Join(dir, ".bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, to := range []string{filepath.Join(dir, "omnipd"), filepath.Join(dir, ".bin", "omnipd")} {
		if err := copyFile(bin, to); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

// blockPrologue brings up the namespace's loopback and, at the end,
// whatever way the block ends, stops what it left running (SIGTERM, so that
// a serve drains and its workers free their shared memory) and waits for
// it. servePrologue starts omnipd serve for a serve block, and waits until
// it is ready.
const (
	blockPrologue = `set -e -o pipefail
trap 'doc_test_status=$?; kill $(jobs -p) 2> /dev/null || true; wait; exit $doc_test_status' EXIT
ip link set lo up
`
	servePrologue = `omnipd serve > .doc-test-serve.log 2>&1 &
for i in $(seq 600); do
  curl -sf localhost:8000/health > /dev/null && break
  kill -0 %1 || { cat .doc-test-serve.log; exit 1; }
  sleep 0.2
done
`
)

// runBlock runs b in dir, isolated, and fails t unless it succeeds.
func runBlock(t *testing.T, isolate []string, dir string, b shellBlock) {
	script := blockPrologue
	if b.mode == "serve" {
		script += servePrologue
	}
	script += b.text
	ctx, cancel := context.WithTimeout(t.Context(), docBlockBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, isolate[0], append(isolate[1:], "bash", "-c", script)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+filepath.Join(dir, ".bin")+string(os.PathListSeparator)+os.Getenv("PATH"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Errorf("%s failed (%v):\n%s\noutput:\n%s", b, err, b.text, tail(out.String(), 60))
	} else if testing.Verbose() {
		t.Logf("output:\n%s", tail(out.String(), 20))
	}
}

// tail is the last n lines of s, each cut to a few hundred bytes (an
// answer's base64 audio is one line).
func tail(s string, n int) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		l := sc.Text()
		if len(l) > 400 {
			l = l[:400] + "…"
		}
		lines = append(lines, l)
	}
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
