package vllmplan_test

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/omnipd/omnipd/deploy"
	vllmomnistage "github.com/omnipd/omnipd/vllm-omni-stage"
	"github.com/omnipd/omnipd/vllmplan"
)

// fakePython is the python3 a stage-worker launch.sh finds on PATH: the
// import check passes unless FAKE_VLLM_OMNI is "missing"; python3 -m
// omnipd_stage records its arguments and environment (argv.PID, env.PID)
// and becomes the test binary's fake engine, which answers /health on
// --port until SIGTERM.
const fakePython = `#!/bin/sh
case "$1" in
-c) [ "${FAKE_VLLM_OMNI:-}" = missing ] && exit 1; exit 0 ;;
-m) ;;
*) echo "fake python3: unexpected $*" >&2; exit 9 ;;
esac
printf '%s\n' "$@" > "argv.$$"
env > "env.$$"
OMNIPD_FAKE_VLLM=serve exec SELF "$@"
`

type lockedOutput struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *lockedOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *lockedOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// freePortRun is a port p with p..p+n-1 free, for a plan of n instances.
func freePortRun(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		first, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := first.Addr().(*net.TCPAddr).Port
		held := []net.Listener{first}
		for i := 1; i < n; i++ {
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+i))
			if err != nil {
				break
			}
			held = append(held, ln)
		}
		for _, ln := range held {
			ln.Close()
		}
		if len(held) == n {
			return p
		}
	}
	t.Fatalf("no %d adjacent free ports", n)
	return 0
}

// startStageScript writes the plan's launch.sh into a fresh directory and
// runs it with the fake python3 first on PATH.
func startStageScript(t *testing.T, plan *vllmplan.VLLMPlan, env ...string) (dir string, cmd *exec.Cmd, out *lockedOutput, done chan struct{}) {
	t.Helper()
	dir = t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "launch.sh"), []byte(plan.Shell()), 0o644); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "python3"), []byte(strings.ReplaceAll(fakePython, "SELF", self)), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command("sh", "launch.sh")
	cmd.Dir = dir
	cmd.Env = append([]string{"HOME=" + dir, "PATH=" + bin + ":/usr/bin:/bin", "PYTHONPATH=/where/vllm_omni/is"}, env...)
	out = &lockedOutput{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done = make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	return dir, cmd, out, done
}

func TestStageWorkerScriptWithoutVLLMOmniFailsAtOnce(t *testing.T) {
	plan, err := vllmplan.PlanVLLM(loadFile(t, omniFixture, deploy.Options{}), vllmplan.VLLMOptions{BasePort: freePortRun(t, 3)})
	if err != nil {
		t.Fatal(err)
	}
	dir, cmd, out, done := startStageScript(t, plan, "FAKE_VLLM_OMNI=missing")
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("launch.sh still running without vllm_omni:\n%s", out.String())
	}
	o := out.String()
	if code := cmd.ProcessState.ExitCode(); code != 127 || strings.Count(strings.TrimSpace(o), "\n") != 0 || !strings.Contains(o, "python3 cannot import vllm_omni") || !strings.Contains(o, vllmomnistage.VLLMOmniVersion) {
		t.Errorf("exit %d, want 127 and one line naming vllm_omni and the release:\n%s", code, o)
	}
	if _, err := os.Stat(filepath.Join(dir, vllmplan.StageWorkerDir)); err == nil {
		t.Error("the worker's files were written before the check failed")
	}
}

// The script writes the embedded worker and the vllm-omni deploy config,
// then starts every stage worker with its command line and environment
// (the deployment secret as VLLM_API_KEY, the worker's directory as an
// absolute PYTHONPATH in front of the one the script runs with, where
// python3 found vllm_omni), waits for each /health and says what to run
// next.
func TestStageWorkerScriptStartsEveryStage(t *testing.T) {
	doc := loadFile(t, omniFixture, deploy.Options{PD: true, Connector: "NixlConnector"})
	plan, err := vllmplan.PlanVLLM(doc, vllmplan.VLLMOptions{BasePort: freePortRun(t, 4)})
	if err != nil {
		t.Fatal(err)
	}
	dir, cmd, out, done := startStageScript(t, plan)
	for deadline := time.Now().Add(2 * time.Minute); !strings.Contains(out.String(), "every instance is ready"); time.Sleep(50 * time.Millisecond) {
		select {
		case <-done:
			t.Fatalf("launch.sh exited %v:\n%s", cmd.ProcessState, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("launch.sh did not report the stage workers ready:\n%s", out.String())
		}
	}

	for _, f := range vllmomnistage.Files() {
		got, err := os.ReadFile(filepath.Join(dir, vllmplan.StageWorkerDir, f.Name))
		want := f.Data
		if len(want) > 0 && want[len(want)-1] != '\n' {
			want = append(slices.Clone(want), '\n')
		}
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s written as %q (%v), want the embedded file", f.Name, got, err)
		}
	}
	if got, err := os.ReadFile(filepath.Join(dir, vllmplan.StageDeployConfigFile)); err != nil || !bytes.Equal(got, plan.DeployConfig) {
		t.Errorf("%s written as\n%s(%v)\nwant\n%s", vllmplan.StageDeployConfigFile, got, err, plan.DeployConfig)
	}
	secret, err := os.ReadFile(filepath.Join(dir, vllmplan.VLLMSecretFile))
	if err != nil || len(secret) == 0 {
		t.Fatalf("no deployment secret: %v", err)
	}

	argvs, _ := filepath.Glob(filepath.Join(dir, "argv.*"))
	if len(argvs) != len(plan.Commands) {
		t.Fatalf("%d stage workers started, %d planned", len(argvs), len(plan.Commands))
	}
	for _, a := range argvs {
		b, err := os.ReadFile(a)
		if err != nil {
			t.Fatal(err)
		}
		argv := append([]string{"python3"}, strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")...)
		i := slices.IndexFunc(plan.Commands, func(c vllmplan.VLLMCommand) bool { return slices.Equal(c.Argv, argv) })
		if i < 0 {
			t.Errorf("a stage worker started as %q, which the plan has not", argv)
			continue
		}
		c := plan.Commands[i]
		envb, err := os.ReadFile(filepath.Join(dir, "env."+strings.TrimPrefix(filepath.Ext(a), ".")))
		if err != nil {
			t.Fatal(err)
		}
		env := strings.Split(string(envb), "\n")
		for _, want := range append(slices.DeleteFunc(slices.Clone(c.Env), func(e string) bool { return strings.HasPrefix(e, "PYTHONPATH=") }),
			"PYTHONPATH="+filepath.Join(dir, vllmplan.StageWorkerDir)+":/where/vllm_omni/is", "VLLM_API_KEY="+string(secret)) {
			if !slices.Contains(env, want) {
				t.Errorf("%s: environment lacks %s", c.Name, want)
			}
		}
	}
}
