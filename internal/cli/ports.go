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
// default port — is picked free by the kernel. Each stays bound from then
// on, and its listener is handed to its worker (launch.Spec), never closed
// for the worker to bind again: two picks cannot coincide, a taken chosen
// port fails before any worker runs, and no other process can be given a
// port between its pick and its worker.
type localPorts struct {
	byReplica map[replicaKey]*replicaPorts
}

type replicaKey struct{ stage, replica int }

type replicaPorts struct {
	http, kv int
	// kvWhy says where the KV port came from, for the start-up line.
	kvWhy        string
	httpLn, kvLn *net.TCPListener // kvLn nil when there is no KV port
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
			rp.httpLn = ln.(*net.TCPListener)
			rp.http = rp.httpLn.Addr().(*net.TCPAddr).Port
			if s.ModelStage != "thinker" || s.KV == nil || s.KV.Connector != deploy.DefaultKVConnector {
				continue
			}
			host := deploy.KVHost(s)
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
			rp.kvLn = ln.(*net.TCPListener)
			rp.kv = rp.kvLn.Addr().(*net.TCPAddr).Port
		}
	}
	return lp, nil
}

// take returns replica i of stage id's ports, still bound, for its worker.
// Starting the worker (launch.Start, launch.Supervise) closes the listeners
// it is given; until then close still unbinds them, on an early return.
func (lp *localPorts) take(id, i int) replicaPorts {
	rp := lp.byReplica[replicaKey{id, i}]
	if rp == nil {
		return replicaPorts{}
	}
	return *rp
}

// close unbinds every port not handed to a worker (closing one that was
// does nothing).
func (lp *localPorts) close() {
	for _, rp := range lp.byReplica {
		for _, ln := range []*net.TCPListener{rp.httpLn, rp.kvLn} {
			if ln != nil {
				ln.Close()
			}
		}
	}
}
