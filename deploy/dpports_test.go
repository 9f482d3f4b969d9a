package deploy

import (
	"os"
	"slices"
	"testing"
)

// Every DP rank of a NIXL instance listens on the instance's side-channel
// port plus its DP index, so PD expansion spaces instances DP ports apart.
func TestExpandSpacesNixlPortsByDataParallelSize(t *testing.T) {
	data, err := os.ReadFile("testdata/expand/dp_nixl.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc, _, err := Load("testdata/expand/dp_nixl.yaml", data, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var ports [][]int
	for _, s := range doc.Stages[:2] {
		var ps []int
		for _, r := range s.Replicas {
			ps = append(ps, r.KVPort)
		}
		ports = append(ports, ps)
	}
	if want := [][]int{{5600, 5602}, {5604}}; !slices.EqualFunc(ports, want, slices.Equal) {
		t.Errorf("prefill and decode side-channel ports %v, want %v", ports, want)
	}
	if got := doc.Stages[0].Replicas[1].Devices; !slices.Equal(got, []int{2, 3}) {
		t.Errorf("second prefill instance on devices %v, want [2 3]", got)
	}
}

func TestKVPortStride(t *testing.T) {
	nixl, _ := lookupKVConnector("NixlConnector")
	p2p, _ := lookupKVConnector("P2pNcclConnector")
	for _, tc := range []struct {
		spec   kvConnectorSpec
		tp, dp int
		want   int
	}{
		{nixl, 1, 1, 1},
		{nixl, 4, 1, 1}, // one side channel per engine; the handshake names the TP rank
		{nixl, 2, 4, 4},
		{nixl, 1, 0, 1},
		{p2p, 2, 1, 2},
	} {
		if got := kvPortStride(tc.spec, tc.tp, tc.dp); got != tc.want {
			t.Errorf("%s TP %d DP %d: stride %d, want %d", tc.spec.name, tc.tp, tc.dp, got, tc.want)
		}
	}
}
