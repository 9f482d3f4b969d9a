package wiring

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/kvnotice"
	"github.com/omnipd/omnipd/orchestrator"
)

// listenKVNotices starts the receiver of the done notices a contract's
// producer pushes out of band (LMCache PD: ProxyNotif over ZMQ PUSH to the
// sender's pd_proxy_host:pd_proxy_port, given as the "lmcache."-prefixed
// overrides of its kv_connector_extra_config). Nil, nil when the contract
// sends none. omnipd must listen there: an undrained PUSH socket blocks the
// sender once its high-water mark fills, and the decode must wait for the
// notices.
func listenKVNotices(ctx context.Context, c kvconnector.Contract, extra map[string]any, log *slog.Logger) (orchestrator.KVReady, error) {
	if _, ok := c.(kvconnector.DoneNotifier); !ok {
		return nil, nil
	}
	host, _ := extra["lmcache.pd_proxy_host"].(string)
	port, err := strconv.Atoi(fmt.Sprint(extra["lmcache.pd_proxy_port"]))
	if host == "" || err != nil || port < 1 || port > 65535 {
		return nil, fmt.Errorf("%s in PD mode: the prefill's kv_connector_extra_config needs lmcache.pd_proxy_host and lmcache.pd_proxy_port, where omnipd receives the sender's done notices (got %v, %v)",
			c.Name(), extra["lmcache.pd_proxy_host"], extra["lmcache.pd_proxy_port"])
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("listen for %s done notices: %w", c.Name(), err)
	}
	board := &kvnotice.Board{}
	go func() {
		if err := (&kvnotice.Listener{Board: board, Logger: log}).Serve(ctx, ln); err != nil {
			log.Error("kv done-notice listener stopped", "err", err)
		}
	}()
	return board, nil
}
