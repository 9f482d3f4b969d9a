package cli

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// A media flag with a value that cannot be used stops the command before
// anything starts, with an error that names the flag to fix.
func TestMediaFlagErrorsNameTheFlag(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-dir")
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"worker", "--port", "0", "--allowed-local-media-path", missing}, "--allowed-local-media-path"},
		{[]string{"serve", "--port", "0", "--allowed-local-media-path", missing}, "--allowed-local-media-path"},
		{[]string{"worker", "--port", "0", "--allowed-media-domains", "exa mple.com"}, "--allowed-media-domains"},
	} {
		var stdout, stderr bytes.Buffer
		code := Run(context.Background(), tc.args, &stdout, &stderr)
		if code == 0 || !strings.Contains(stderr.String(), "omnipd: "+tc.flag+": ") {
			t.Errorf("%v: exit %d, stderr %q; want an error naming %s", tc.args, code, stderr.String(), tc.flag)
		}
	}
}
