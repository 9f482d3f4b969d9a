package worker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestSharedMemoryConfig(t *testing.T) {
	tests := []struct {
		extra   string
		want    bool
		wantErr string
	}{
		{extra: `{}`, want: true},
		{extra: `{"shared_memory":true}`, want: true},
		{extra: `{"shared_memory":false}`, want: false},
		{extra: `{"shared_memory":"false"}`, wantErr: `kv_connector_extra_config.shared_memory: want true or false, got false`},
		{extra: `{"shared_memory":0}`, wantErr: `kv_connector_extra_config.shared_memory: want true or false, got 0`},
	}
	for _, tt := range tests {
		c, err := ParseKVTransferConfig(`{"kv_connector":"ReferenceConnector","kv_role":"kv_producer","engine_id":"p","kv_connector_extra_config":` + tt.extra + `}`)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: err = %v, want %q", tt.extra, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tt.extra, err)
		}
		if got, _ := c.sharedMemory(); got != tt.want {
			t.Errorf("%s: shared memory %v, want %v", tt.extra, got, tt.want)
		}
	}
}

// kvConfigShared is kvConfig with kv_connector_extra_config.shared_memory.
func kvConfigShared(role, engineID, handshake string, shared bool) string {
	return fmt.Sprintf(`{"kv_connector":"ReferenceConnector","kv_role":%q,"engine_id":%q,"kv_ip":"127.0.0.1","kv_port":0,
		"kv_connector_extra_config":{"handshake":%q,"lease_seconds":3,"shared_memory":%v}}`, role, engineID, handshake, shared)
}

// regionFDs counts this process's descriptors of KV shared memory regions.
func regionFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(target, "/memfd:omnipd-kv") {
			n++
		}
	}
	return n
}

// TestPDSharedMemory: a prefill and a decode on one host move KV through
// the prefill's shared memory when both allow it, and over TCP when either
// turns it off, with the same tokens as colocated either way; closing the
// prefill worker lets go of its region.
func TestPDSharedMemory(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared memory is Linux-only")
	}
	tests := []struct {
		name                   string
		prefillShm, decodeShm  bool
		wantShared, wantRegion bool
	}{
		{name: "both allow", prefillShm: true, decodeShm: true, wantShared: true, wantRegion: true},
		{name: "decode opts out", prefillShm: true, decodeShm: false, wantRegion: true},
		{name: "prefill opts out", prefillShm: false, decodeShm: true},
		{name: "both opt out"},
	}
	for _, handshake := range []string{HandshakePull, HandshakePush} {
		colocated := newTestWorker(t, kvConfig("kv_both", "both-0", handshake))
		for _, tt := range tests {
			t.Run(handshake+"/"+tt.name, func(t *testing.T) {
				fds := regionFDs(t)
				prefill := newTestWorker(t, kvConfigShared("kv_producer", "prefill-0", handshake, tt.prefillShm))
				decode := newTestWorker(t, kvConfigShared("kv_consumer", "decode-0", handshake, tt.decodeShm))
				if got := prefill.kv.region != nil; got != tt.wantRegion {
					t.Fatalf("prefill's cache in shared memory: %v, want %v", got, tt.wantRegion)
				}
				if got := regionFDs(t) - fds; got != map[bool]int{true: 1}[tt.wantRegion] {
					t.Fatalf("%d new region descriptors", got)
				}
				rng := rand.New(rand.NewPCG(21, 22))
				const requests = 6
				for i := range requests {
					prompt := make([]int, 1+rng.IntN(60))
					for j := range prompt {
						prompt[j] = rng.IntN(256)
					}
					id := fmt.Sprintf("shm-%s-%d", handshake, i)
					b := body(prompt, 6, 0.8, int64(i))
					want, _, err := post(context.Background(), colocated.url, id, b)
					if err != nil {
						t.Fatal(err)
					}
					got, err := prefillDecode(context.Background(), prefill, decode, id, b, handshake == HandshakePush)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(got.Choices[0].TokenIDs, want.Choices[0].TokenIDs) {
						t.Errorf("prompt of %d tokens: PD %v, colocated %v", len(prompt), got.Choices[0].TokenIDs, want.Choices[0].TokenIDs)
					}
					if c := got.Usage.PromptTokensDetails.CachedTokens; c != len(prompt)-1 {
						t.Errorf("prompt of %d tokens: %d cached tokens, want %d", len(prompt), c, len(prompt)-1)
					}
				}
				st := decode.kv.consumer.Stats()
				want := requests
				if !tt.wantShared {
					want = 0
				}
				if st.SharedTransfers != uint64(want) || st.StreamedTransfers != uint64(requests-want) {
					t.Errorf("decode's transfers: %+v, want %d through shared memory and %d over TCP", st, want, requests-want)
				}
				// Under pull, the first transfer maps the prefill's region;
				// every later one copies on the prefill's ticket, and the
				// prefill frees each lease on the decode's notification.
				wantTicket := 0
				if tt.wantShared && handshake == HandshakePull {
					wantTicket = requests - 1
				}
				if st.TicketTransfers != uint64(wantTicket) {
					t.Errorf("decode's transfers: %+v, want %d on the prefill's ticket", st, wantTicket)
				}
				// The decode's metrics say the same, by path.
				m := scrape(t, decode.url)
				for path, want := range map[string]int{"ticket": wantTicket, "shared_memory": want - wantTicket, "tcp": requests - want} {
					series := `omnipd_kv_imports_total{model_name="omnipd-reference",path="` + path + `"}`
					if got := metricValue(t, m, series); got != float64(want) {
						t.Errorf("%s = %v, want %d", series, got, want)
					}
				}
				if u := blocksHeldAtRest(prefill); u != 0 {
					t.Errorf("prefill holds %d KV blocks after every transfer", u)
				}

				// The prefill's engine is idle: Close takes its cache out of
				// the region and closes it; the decode lets go of its mapping.
				prefill.Close()
				decode.Close()
				if prefill.kv.region != nil {
					t.Error("prefill worker still holds its region after Close")
				}
				if n := regionFDs(t); n != fds {
					t.Errorf("%d region descriptors after Close, want %d", n, fds)
				}
				if m := decode.kv.consumer.Stats().MappedRegions; m != 0 {
					t.Errorf("decode maps %d regions after Close", m)
				}
				if u := prefill.eng.Cache().Used(); u != 0 {
					t.Errorf("prefill holds %d blocks", u)
				}
			})
		}
	}
}
