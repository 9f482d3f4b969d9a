package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestBinary builds the real binary and runs the README's main command and
// a validation the way a user does.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "omnipd")
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	run := func(args ...string) (int, string, string) {
		cmd := exec.Command(bin, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("run %v: %v", args, err)
		}
		return code, stdout.String(), stderr.String()
	}

	code, out, errOut := run("expand")
	if code != 0 || !strings.Contains(out, "is_prefill_only: true") || !strings.Contains(out, "is_decode_only: true") {
		t.Errorf("omnipd expand: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}

	fixture := "../../deploy/testdata/fixtures/vllm-omni/legacy_qwen3_omni_moe_pd_separation.yaml"
	code, out, errOut = run("validate", fixture)
	if code != 0 || !strings.Contains(out, "MooncakeConnector") || !strings.Contains(errOut, "legacy stage_args") {
		t.Errorf("omnipd validate legacy PD: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("stages:\n  - stage_id: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run("validate", bad)
	if code != 1 || out != "" || !strings.Contains(errOut, bad+":2:15: stages[0].stage_id: ") {
		t.Errorf("omnipd validate bad config: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}
