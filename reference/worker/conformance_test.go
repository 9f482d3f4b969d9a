package worker

import (
	"net"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/reference/engine/code2wav"
	"github.com/omnipd/omnipd/reference/engine/talker"
	"github.com/omnipd/omnipd/stageapi/stagetest"
)

// The reference workers pass the stage API's conformance suite, with the
// reference KV connector over either handshake.
func TestStageAPIConformance(t *testing.T) {
	for _, handshake := range []string{HandshakePull, HandshakePush} {
		t.Run(handshake, func(t *testing.T) {
			stagetest.Run(t, referenceDeployment(t, handshake))
		})
	}
}

// referenceDeployment starts reference workers in-process, each on a
// loopback port of its own, as the worker's other tests do.
func referenceDeployment(t *testing.T, handshake string) stagetest.Deployment {
	contract, err := kvconnector.NewRegistry().Lookup(kvconnector.ReferenceConnector, map[string]any{"handshake": handshake})
	if err != nil {
		t.Fatal(err)
	}
	return stagetest.Deployment{
		Secret: testSecret,
		Model:  "omnipd-reference",
		Layer:  2,
		Thinker: func(t *testing.T) string {
			return newTestWorker(t, "").url
		},
		PD: func(t *testing.T) stagetest.Pair {
			prefill := newTestWorker(t, kvConfig("kv_producer", "prefill-0", handshake))
			decode := newTestWorker(t, kvConfig("kv_consumer", "decode-0", handshake))
			host, port, err := net.SplitHostPort(prefill.KVAddr())
			if err != nil {
				t.Fatal(err)
			}
			kvPort, _ := strconv.Atoi(port)
			return stagetest.Pair{
				Prefill: prefill.url, Decode: decode.url, KV: contract,
				PrefillPeer: kvconnector.Peer{EngineID: "prefill-0", KVHost: host, KVPort: kvPort},
				DecodePeer:  kvconnector.Peer{EngineID: "decode-0"},
			}
		},
		Talker: func(t *testing.T) string {
			hs := httptest.NewServer(NewTalker(talker.Default(), talker.DefaultSegmenter(), testSecret, quietLog()))
			t.Cleanup(hs.Close)
			return hs.URL
		},
		Code2Wav: func(t *testing.T) string {
			hs := httptest.NewServer(NewCode2Wav(code2wav.Default(), testSecret, quietLog()))
			t.Cleanup(hs.Close)
			return hs.URL
		},
	}
}
