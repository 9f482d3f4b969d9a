package kvconnector_test

import (
	"fmt"

	"github.com/omnipd/omnipd/kvconnector"
)

// The orchestrator's side of one PD request with Mooncake: the decode leg is
// built before the prefill answers, because Mooncake's prefill answers null.
func ExampleRegistry_Lookup() {
	contracts := kvconnector.NewRegistry()
	c, err := contracts.Lookup("MooncakeConnector", map[string]any{"mooncake_bootstrap_port": 25201})
	if err != nil {
		panic(err)
	}
	h := kvconnector.NewHandoff("req-1",
		kvconnector.Peer{EngineID: "prefill-0", KVHost: "10.0.0.1", KVPort: 25201, HTTPAddr: "10.0.0.1:8100"},
		kvconnector.Peer{EngineID: "decode-0", KVHost: "10.0.0.2", KVPort: 25202, HTTPAddr: "10.0.0.2:8200"})
	prefillID, decodeID := c.RequestIDs(h)
	decode, err := c.DecodeParams(h, nil)
	fmt.Println(c.Dispatch(), prefillID, decodeID)
	fmt.Println(c.PrefillParams(h))
	fmt.Println(decode, err)

	_, err = contracts.Lookup("PyNcclConnector", nil)
	fmt.Println(err)
	// Output:
	// concurrent req-1 req-1
	// map[do_remote_decode:true do_remote_prefill:false transfer_id:xfer-req-1]
	// map[do_remote_decode:false do_remote_prefill:true remote_bootstrap_addr:http://10.0.0.1:25201 remote_engine_id:prefill-0 transfer_id:xfer-req-1] <nil>
	// unknown KV connector "PyNcclConnector"; known connectors are LMCacheConnectorV1, MoRIIOConnector, MooncakeConnector, MultiConnector, NixlConnector, P2pNcclConnector, ReferenceConnector
}
