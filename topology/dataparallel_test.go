package topology

import "testing"

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
	for _, k := range testSupport().KV {
		if !k.DataParallel {
			continue
		}
		c := k.Name
		t.Run(c+" routed", func(t *testing.T) {
			if vs := Validate(validDPPD(c)); len(vs) != 0 {
				t.Fatalf("a DP decode over %s: got %v, want none", c, vs)
			}
		})
	}
	for _, k := range testSupport().KV {
		if k.DataParallel {
			continue
		}
		c := k.Name
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

// A DP instance's ranks listen on its KV port plus their DP index, so the
// port check counts each instance's range, not only its first port.
func TestValidateDataParallelKVPortRanges(t *testing.T) {
	for _, tc := range []struct {
		name            string
		prefillDP       int
		prefill, decode int
		clash           bool
	}{
		{name: "decode ranks reach the prefill's port", decode: 25200, prefill: 25201, clash: true},
		{name: "prefill ranks reach the decode's port", prefillDP: 2, prefill: 25201, decode: 25202, clash: true},
		{name: "ranges apart", prefillDP: 2, prefill: 25201, decode: 25203},
		{name: "decode ranks below the prefill's", decode: 25199, prefill: 25201},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp := validDPPD("NixlConnector")
			p := &tp.Stages[0]
			if tc.prefillDP > 1 {
				p.DataParallelSize = tc.prefillDP
				setDevices(p, 0, 4)
			}
			p.Replicas[0].KVPort = tc.prefill
			tp.Stages[1].Replicas[0].KVPort = tc.decode
			var clashes []Violation
			for _, v := range Validate(tp) {
				if v.Code == CodeKVPortDuplicate {
					clashes = append(clashes, v)
				}
			}
			if tc.clash != (len(clashes) == 1) || len(clashes) > 1 {
				t.Fatalf("prefill DP %d at %d, decode DP 2 at %d: port clashes %v, want clash %v", max(1, tc.prefillDP), tc.prefill, tc.decode, clashes, tc.clash)
			}
		})
	}
}
