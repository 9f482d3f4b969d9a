package cli

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/omnipd/omnipd/deploy"
)

// localPorts are the ports of the reference workers serve starts on this
// host, settled before the first starts: a port the config chose (pd.kv_port
// and the like) is checked free, and a port nobody chose — a worker's HTTP
// port, a KV side channel the embedded default or PD expansion gave a
// default port — is picked free by the kernel. Each stays bound here until
// its worker is about to start, so that two picks cannot coincide and a
// taken chosen port fails before any worker runs.
type localPorts struct {
	byReplica map[replicaKey]*replicaPorts
}

type replicaKey struct{ stage, replica int }

type replicaPorts struct {
	http, kv int
	// kvWhy says where the KV port came from, for the start-up line.
	kvWhy string
	held  []net.Listener
}

// planLocalPorts settles the ports of every replica of doc that names no
// endpoint. On error nothing stays bound.
func planLocalPorts(doc *deploy.Document) (*localPorts, error) {
	lp := &localPorts{byReplica: map[replicaKey]*replicaPorts{}}
	for _, s := range doc.Stages {
		chosen := s.KVPortsChosen()
		for i, r := range s.Replicas {
			if r.Endpoint != "" {
				continue
			}
			rp := &replicaPorts{}
			lp.byReplica[replicaKey{s.ID, i}] = rp
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				lp.close()
				return nil, fmt.Errorf("stage %d: find a free port for its worker: %w", s.ID, err)
			}
			rp.held = append(rp.held, ln)
			rp.http = ln.Addr().(*net.TCPAddr).Port
			if s.ModelStage != "thinker" || s.KV == nil || s.KV.Connector != deploy.DefaultKVConnector {
				continue
			}
			host := kvHost(s)
			if chosen {
				ln, err = net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(r.KVPort)))
				if err != nil {
					lp.close()
					return nil, fmt.Errorf("stage %d (%s) replica %d: its KV side channel's port %d, chosen in the config, is taken (%w); free it or choose another kv_port",
						s.ID, s.Role, i, r.KVPort, errors.Unwrap(err))
				}
				rp.kvWhy = "as configured"
			} else {
				ln, err = net.Listen("tcp", net.JoinHostPort(host, "0"))
				if err != nil {
					lp.close()
					return nil, fmt.Errorf("stage %d: find a free port for its KV side channel: %w", s.ID, err)
				}
				rp.kvWhy = "a free port; set pd.kv_port to choose"
			}
			rp.held = append(rp.held, ln)
			rp.kv = ln.Addr().(*net.TCPAddr).Port
		}
	}
	return lp, nil
}

// take returns replica i of stage id's ports and unbinds them, for its
// worker to bind.
func (lp *localPorts) take(id, i int) replicaPorts {
	rp := lp.byReplica[replicaKey{id, i}]
	if rp == nil {
		return replicaPorts{}
	}
	for _, ln := range rp.held {
		ln.Close()
	}
	rp.held = nil
	return *rp
}

// close unbinds every port still held.
func (lp *localPorts) close() {
	for _, rp := range lp.byReplica {
		for _, ln := range rp.held {
			ln.Close()
		}
		rp.held = nil
	}
}
