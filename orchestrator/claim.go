package orchestrator

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/omnipd/omnipd/kvconnector"
)

// KV the decode will not use. When a request ends between a prefill that
// exported KV and a decode that would have imported it, omnipd can send the
// decode a one-token claim (claimAndDrop) so that the decode imports, and
// the prefill frees, the blocks before the engine's own timeout. Whether
// the claim helps depends on why the request ended and on the decode's vLLM
// release (docs/kv-connectors/README.md, "KV the decode will not use"):
//
//   - The client left between the legs: no decode saw the request, so no
//     engine frees the KV on its own on any release. Claim.
//   - The decode refused the leg (HTTP 400) before importing: since vLLM
//     0.21.0 the decode's frontend hands the refused request to the engine
//     pre-aborted, and NIXL's and Mooncake's consumers then tell the
//     prefill to free the blocks. A claim after that reads blocks the
//     prefill freed (NIXL) or waits for a transfer the prefill released
//     until the claim deadline (Mooncake). Claim only on older releases, on
//     other connectors, and where the release is unknown.

// claimCause says why exported KV is not going to be used.
type claimCause int

const (
	// claimRejected: the decode refused the leg before importing.
	claimRejected claimCause = iota + 1
	// claimAbandoned: the client left between the legs; the decode never
	// saw the request.
	claimAbandoned
)

func (c claimCause) String() string {
	if c == claimRejected {
		return "decode refused the request"
	}
	return "client left between the legs"
}

// claimDeadline bounds one claim-and-drop decode.
const claimDeadline = 30 * time.Second

// vllmRelease is a vLLM version as GET /version reports it. The zero value
// is unknown.
type vllmRelease struct {
	major, minor, patch int
	// pre: a release candidate or a development build, which may predate
	// the release's changes.
	pre   bool
	known bool
}

// parseRelease reads "0.21.0", "0.21.0rc1", "0.20.2.dev12+g1234abc",
// "0.11.0+cu128". Anything else is unknown.
func parseRelease(s string) vllmRelease {
	s = strings.TrimPrefix(strings.TrimSpace(s), "v")
	if i := strings.IndexByte(s, '+'); i >= 0 {
		s = s[:i] // a local build label: the same release
	}
	var r vllmRelease
	nums := [3]*int{&r.major, &r.minor, &r.patch}
	for i, n := range nums {
		j := 0
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j == 0 {
			return vllmRelease{}
		}
		*n, _ = strconv.Atoi(s[:j])
		s = s[j:]
		if i < len(nums)-1 {
			if !strings.HasPrefix(s, ".") {
				return vllmRelease{}
			}
			s = s[1:]
		}
	}
	r.pre = s != "" && !strings.HasPrefix(s, ".post")
	r.known = true
	return r
}

// atLeast reports whether r is known and is o or later; a pre-release of o
// is not.
func (r vllmRelease) atLeast(o vllmRelease) bool {
	if !r.known {
		return false
	}
	a, b := [3]int{r.major, r.minor, r.patch}, [3]int{o.major, o.minor, o.patch}
	for i := range a {
		if a[i] != b[i] {
			return a[i] > b[i]
		}
	}
	return !r.pre
}

// refusalFreesKV is the first vLLM release whose decode, refusing a leg
// that carries do_remote_prefill, has the prefill free the blocks itself
// (PR #41269).
var refusalFreesKV = vllmRelease{major: 0, minor: 21, known: true}

// claimAfter reports whether a claim-and-drop decode should follow, for the
// connector named (a Contract's Name), the cause, and the decode's release.
func claimAfter(connector string, cause claimCause, decode vllmRelease) bool {
	if cause != claimRejected {
		return true
	}
	// MultiConnector hands request_finished to every child: the PD
	// child's behaviour is the one that matters.
	if inner, ok := strings.CutPrefix(connector, kvconnector.MultiConnector+"("); ok {
		connector = strings.TrimSuffix(inner, ")")
	}
	switch connector {
	case kvconnector.NixlConnector, kvconnector.MooncakeConnector:
		return !decode.atLeast(refusalFreesKV)
	}
	return true
}

// releaseCache holds what an instance's /version said, until the instance
// comes back from an ejection (it may have restarted as another release).
type releaseCache struct {
	mu    sync.Mutex
	asked bool
	r     vllmRelease
}

func (c *releaseCache) forget() {
	c.mu.Lock()
	c.asked, c.r = false, vllmRelease{}
	c.mu.Unlock()
}

// versionTimeout bounds one /version call.
const versionTimeout = 5 * time.Second

// release returns the instance's vLLM release, asking /version the first
// time. A failed call counts as unknown and is asked again next time; an
// instance that has no /version (a reference worker) is unknown for good.
func (in *Instance) release(ctx context.Context, log *slog.Logger) vllmRelease {
	in.rel.mu.Lock()
	asked, r := in.rel.asked, in.rel.r
	in.rel.mu.Unlock()
	if asked {
		return r
	}
	ctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	v, err := in.Client.Version(ctx)
	if err != nil {
		log.Debug("could not learn the engine's version", "instance", in.Client.BaseURL(), "err", err)
		return vllmRelease{}
	}
	r = parseRelease(v)
	in.rel.mu.Lock()
	in.rel.asked, in.rel.r = true, r
	in.rel.mu.Unlock()
	return r
}

// claimWanted decides, for the claim-and-drop decode claimAndDrop is about
// to send to dec, whether it is worth sending.
func (o *Orchestrator) claimWanted(ctx context.Context, dec *Instance, cause claimCause, log *slog.Logger) bool {
	if cause != claimRejected {
		return true
	}
	r := dec.release(ctx, log)
	if claimAfter(o.cfg.Contract.Name(), cause, r) {
		return true
	}
	log.Debug("no claim: the decode's engine has the prefill free the KV of a request it refused",
		"connector", o.cfg.Contract.Name(), "vllm", strconv.Itoa(r.major)+"."+strconv.Itoa(r.minor)+"."+strconv.Itoa(r.patch))
	return false
}
