package cli

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A KV port the config chose that another process holds fails serve before
// it starts any worker, naming the port and where it was chosen.
func TestServeChosenKVPortTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	cfg := filepath.Join(t.TempDir(), "deploy.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`pipeline: qwen3_omni_moe_thinker
stages:
  - stage_id: 0
    devices: "0,1"
pd: {connector: ReferenceConnector, kv_port: %d}
`, port)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, errOut := &lockedBuffer{}, &lockedBuffer{}
	code := Run(ctx, []string{"serve", "--port", "0", "--config", cfg}, out, errOut)
	if code == 0 || !strings.Contains(errOut.String(), fmt.Sprintf("port %d, chosen in the config, is taken", port)) {
		t.Errorf("exit %d; want a failure naming port %d:\n%s\n%s", code, port, out.String(), errOut.String())
	}
	if strings.Contains(out.String(), "starting reference worker") {
		t.Errorf("serve started workers before it found the port taken:\n%s", out.String())
	}
}
