package e2e

import (
	"io"
	"net/http"
	"regexp"
	"testing"

	"github.com/omnipd/omnipd/internal/testbed"
)

// requestsTotal is omnipd_requests_total{path,status} on d's /metrics.
func requestsTotal(t *testing.T, d *testbed.Deployment, path, status string) string {
	t.Helper()
	resp, err := d.Client.Get(d.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	re := regexp.MustCompile(`(?m)^omnipd_requests_total\{path="` + path + `",status="` + status + `"\} (\S+)$`)
	if g := re.FindSubmatch(b); g != nil {
		return string(g[1])
	}
	return "0"
}

// A client that hangs up mid-decode is counted as cancelled (499) under the
// path its request took through prefill and decode, not as a 200; and it
// leaves nothing behind.
func TestCancelledStreamIsCountedUnderItsPath(t *testing.T) {
	d := testbed.Start(t, testbed.Options{})
	warm(t, d)
	before := requestsTotal(t, d, "disaggregated", "200")
	s := openStream(t, d, chatPath, longChat("count me as cancelled", true))
	if !s.until(hasContent) {
		t.Fatal("the stream ended before its first token")
	}
	s.close()
	waitFor(t, `omnipd_requests_total{path="disaggregated",status="499"} 1`, func() bool {
		return requestsTotal(t, d, "disaggregated", "499") == "1"
	})
	if after := requestsTotal(t, d, "disaggregated", "200"); after != before {
		t.Errorf("a cancelled stream was counted as a 200: %s before, %s after", before, after)
	}
	d.Settled(t, settleWithin)
}
