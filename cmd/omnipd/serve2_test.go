package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// servingProcess is one running `omnipd serve`.
type servingProcess struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan struct{} // closed when the process has ended, err set
	err    error
}

func startServe(t *testing.T, bin string, args ...string) *servingProcess {
	t.Helper()
	p := &servingProcess{cmd: exec.Command(bin, append([]string{"serve"}, args...)...), out: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited // Kill cannot be ignored
		}
	})
	return p
}

var servingOn = regexp.MustCompile(`omnipd serving .* on (http://\S+)`)

// url waits for the serving line and then for /health to be 200.
func (p *servingProcess) url(t *testing.T) string {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		if m := servingOn.FindStringSubmatch(p.out.String()); m != nil {
			if resp, err := http.Get(m[1] + "/health"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return m[1]
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("omnipd serve not healthy within 90s:\n%s", p.out.String())
		}
		select {
		case <-p.exited:
			t.Fatalf("omnipd serve exited: %v\n%s", p.err, p.out.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func chatOnce(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"messages":[{"role":"user","content":"Hello!"}],"max_tokens":4,"modalities":["text"]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Omnipd-Pd-Path") != "disaggregated" {
		t.Errorf("chat at %s: %d %s %s", url, resp.StatusCode, resp.Header.Get("X-Omnipd-Pd-Path"), body)
	}
}

// Two omnipd serve of the embedded default on one host: the KV side
// channels nobody chose are free ports of their own, so both serve. A third
// on a --port that is taken fails at once, naming the port, before it
// starts any worker.
func TestTwoServesShareAHost(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	first := startServe(t, bin, "--port", "0")
	firstURL := first.url(t)
	second := startServe(t, bin, "--port", "0")
	secondURL := second.url(t)
	chatOnce(t, firstURL)
	chatOnce(t, secondURL)
	for _, p := range []*servingProcess{first, second} {
		if n := len(regexp.MustCompile(`KV side channel 127\.0\.0\.1:\d+`).FindAllString(p.out.String(), -1)); n != 2 {
			t.Errorf("want the prefill's and the decode's KV side-channel address in the start-up lines, found %d:\n%s", n, p.out.String())
		}
	}

	port := firstURL[strings.LastIndex(firstURL, ":")+1:]
	third := startServe(t, bin, "--port", port)
	select {
	case <-third.exited:
		err, out := third.err, third.out.String()
		if err == nil || !strings.Contains(out, fmt.Sprintf("127.0.0.1:%s", port)) || !strings.Contains(out, "address already in use") {
			t.Errorf("serve on a taken --port %s: %v\n%s", port, err, out)
		}
		if strings.Contains(out, "starting reference worker") {
			t.Errorf("serve on a taken --port started workers:\n%s", out)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("serve on a taken --port %s is still running after 30s:\n%s", port, third.out.String())
	}
}

// childrenOf lists the processes whose parent is pid (Linux /proc).
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	var kids []int
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so cut after ")".
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			kids = append(kids, n)
		}
	}
	return kids
}

// The deployment secret never appears in a command line — serve's or any
// worker's, whatever flags serve passes on (--debug-addr, --simulate) —
// since every user of the host can read those; the workers get it in their
// environment, which only their user can.
func TestSecretNeverInArgv(t *testing.T) {
	if testing.Short() || runtime.GOOS != "linux" {
		t.Skip("builds and runs the binary; reads /proc")
	}
	const secret = "argv-probe-s3cret"
	bin := buildBinary(t)
	t.Setenv("OMNIPD_SECRET", secret)
	p := startServe(t, bin, "--port", "0", "--debug-addr", "127.0.0.1:0", "--simulate", "zero")
	p.url(t)
	kids := childrenOf(t, p.cmd.Process.Pid)
	if len(kids) != 4 {
		t.Fatalf("want serve's 4 workers as its children, found %v", kids)
	}
	for _, pid := range append(kids, p.cmd.Process.Pid) {
		argv, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(argv, []byte(secret)) {
			t.Errorf("process %d has the secret in its command line: %q", pid, argv)
		}
		if pid == p.cmd.Process.Pid {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			t.Skipf("cannot read a worker's environment here: %v", err)
		}
		if !bytes.Contains(env, []byte("OMNIPD_SECRET="+secret+"\x00")) {
			t.Errorf("worker %d (%q) did not get the secret in its environment", pid, argv)
		}
	}
}
