package wiring

import (
	"context"
	"log/slog"
	"testing"

	"github.com/omnipd/omnipd/kvconnector"
)

// The wiring refuses LMCache PD mode with nowhere to receive the sender's done
// notices (the decode would never be sent), and starts nothing for
// storage mode.
func TestListenKVNotices(t *testing.T) {
	ctx, log := context.Background(), slog.New(slog.DiscardHandler)
	reg := kvconnector.NewRegistry()
	storage, _ := reg.Lookup(kvconnector.LMCacheConnectorV1, nil)
	if r, err := listenKVNotices(ctx, storage, nil, log); r != nil || err != nil {
		t.Errorf("storage mode: %v, %v; want nothing", r, err)
	}
	extra := map[string]any{"lmcache.enable_pd": true, "lmcache.pd_role": "sender"}
	pd, err := reg.Lookup(kvconnector.LMCacheConnectorV1, extra)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := listenKVNotices(ctx, pd, extra, log); err == nil {
		t.Error("PD mode without lmcache.pd_proxy_host/port was accepted")
	}
}
