package orchestrator

import (
	"net/http"
	"strconv"
)

// rankHeaderName is the header vLLM's API server reads to run a request on
// one data-parallel rank (vllm/entrypoints/openai/engine/serving.py,
// _get_data_parallel_rank); without it, its own balancer picks.
const rankHeaderName = "X-data-parallel-rank"

// nextRank chooses the data-parallel rank of in for the next PD leg, each
// rank in turn: the router must know where a leg runs, because each rank
// is a KV engine of its own. 0 on an instance without DP.
func (in *Instance) nextRank() int {
	n := in.Peer.DataParallel()
	if n == 1 {
		return 0
	}
	return int((in.rank.Add(1) - 1) % uint64(n))
}

// rankHeader pins a leg to rank of in; nil on an instance without DP,
// whose engine has nothing to choose.
func rankHeader(in *Instance, rank int) http.Header {
	if in.Peer.DataParallel() == 1 {
		return nil
	}
	return http.Header{rankHeaderName: {strconv.Itoa(rank)}}
}
