package topology

import (
	"slices"
	"testing"
)

// validDPPD is validPD with a decode of data_parallel_size 2 (two DP ranks
// behind one API server, one device each) over the given connector.
func validDPPD(connector string) *Topology {
	t := validPD()
	for i := range t.Stages[:2] {
		t.Stages[i].KV.Connector = connector
	}
	d := &t.Stages[1]
	d.DataParallelSize = 2
	setDevices(d, 1, 3)
	return t
}

func TestValidateDataParallel(t *testing.T) {
	for _, c := range DataParallelConnectors {
		t.Run(c+" routed", func(t *testing.T) {
			if vs := Validate(validDPPD(c)); len(vs) != 0 {
				t.Fatalf("a DP decode over %s: got %v, want none", c, vs)
			}
		})
	}
	for _, c := range KnownConnectors {
		if slices.Contains(DataParallelConnectors, c) {
			continue
		}
		t.Run(c+" refused", func(t *testing.T) {
			vs := Validate(validDPPD(c))
			if len(vs) != 1 || vs[0].Code != CodePDDataParallelUnroutable || vs[0].Stage != 1 || vs[0].Field != "data_parallel_size" {
				t.Fatalf("a DP decode over %s: got %v, want one %s at stages[1].data_parallel_size", c, vs, CodePDDataParallelUnroutable)
			}
		})
	}
	t.Run("a DP instance needs TP x DP devices", func(t *testing.T) {
		// A colocated Thinker: DP outside PD needs no routing from omnipd.
		tp := validColocated()
		th := &tp.Stages[0]
		th.DataParallelSize = 2
		setDevices(th, 0, 2)
		if vs := Validate(tp); len(vs) != 0 {
			t.Fatalf("two devices for TP 1 x DP 2: got %v, want none", vs)
		}
		setDevices(th, 0)
		vs := Validate(tp)
		if len(vs) != 1 || vs[0].Code != CodeDevicesCountMismatch {
			t.Fatalf("one device for TP 1 x DP 2: got %v, want one %s", vs, CodeDevicesCountMismatch)
		}
	})
	t.Run("negative size", func(t *testing.T) {
		tp := validPD()
		tp.Stages[2].DataParallelSize = -1
		vs := Validate(tp)
		if len(vs) != 1 || vs[0].Code != CodeDataParallelSizeInvalid {
			t.Fatalf("got %v, want one %s", vs, CodeDataParallelSizeInvalid)
		}
	})
}
