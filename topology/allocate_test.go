package topology

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestAllocatePD(t *testing.T) {
	tests := []struct {
		name string
		pool []int
		req  LayoutRequest
		want Layout
	}{
		{"1P1D tp1", []int{0, 1, 2}, LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 1, DecodeReplicas: 1, DownstreamSize: 1},
			Layout{Prefill: [][]int{{0}}, Decode: [][]int{{1}}, Downstream: []int{2}}},
		{"1P1D tp2", []int{0, 1, 2, 3, 4}, LayoutRequest{TensorParallelSize: 2, PrefillReplicas: 1, DecodeReplicas: 1, DownstreamSize: 1},
			Layout{Prefill: [][]int{{0, 1}}, Decode: [][]int{{2, 3}}, Downstream: []int{4}}},
		{"2P1D", []int{0, 1, 2, 3}, LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 2, DecodeReplicas: 1, DownstreamSize: 1},
			Layout{Prefill: [][]int{{0}, {1}}, Decode: [][]int{{2}}, Downstream: []int{3}}},
		{"thinker only", []int{0, 1}, LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 1, DecodeReplicas: 1},
			Layout{Prefill: [][]int{{0}}, Decode: [][]int{{1}}}},
		{"1E1P1D tp1: the encoder first", []int{0, 1, 2, 3}, LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 1, DecodeReplicas: 1, DownstreamSize: 1, EncoderReplicas: 1},
			Layout{Encoder: [][]int{{0}}, Prefill: [][]int{{1}}, Decode: [][]int{{2}}, Downstream: []int{3}}},
		{"2E1P1D, encoders tp1 beside a tp2 thinker", []int{0, 1, 2, 3, 4, 5, 6}, LayoutRequest{TensorParallelSize: 2, PrefillReplicas: 1, DecodeReplicas: 1, DownstreamSize: 1, EncoderReplicas: 2, EncoderDevices: 1},
			Layout{Encoder: [][]int{{0}, {1}}, Prefill: [][]int{{2, 3}}, Decode: [][]int{{4, 5}}, Downstream: []int{6}}},
		{"pool order is kept and extra devices left", []int{4, 2, 7, 9}, LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 1, DecodeReplicas: 1, DownstreamSize: 1},
			Layout{Prefill: [][]int{{4}}, Decode: [][]int{{2}}, Downstream: []int{7}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := slices.Clone(tt.pool)
			got, err := AllocatePD(pool, tt.req)
			if err != nil {
				t.Fatalf("AllocatePD: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("AllocatePD = %+v, want %+v", got, tt.want)
			}
			if n := tt.req.Needed(); n != countDevices(got) {
				t.Errorf("Needed = %d, layout uses %d", n, countDevices(got))
			}
			// The layout must not alias the caller's pool.
			for i := range got.Prefill[0] {
				got.Prefill[0][i] = -1
			}
			if !slices.Equal(pool, tt.pool) {
				t.Errorf("writing the layout changed the pool to %v", pool)
			}
		})
	}
}

func countDevices(l Layout) int {
	n := len(l.Downstream)
	for _, s := range slices.Concat(l.Encoder, l.Prefill, l.Decode) {
		n += len(s)
	}
	return n
}

func TestAllocatePDErrors(t *testing.T) {
	ok := LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 1, DecodeReplicas: 1, DownstreamSize: 1}
	tests := []struct {
		name string
		pool []int
		req  LayoutRequest
		want string
	}{
		{"pool too small", []int{0, 1, 2}, LayoutRequest{TensorParallelSize: 2, PrefillReplicas: 1, DecodeReplicas: 1, DownstreamSize: 1},
			"need 5 devices (prefill 1x2, decode 1x2, downstream 1), have 3: 0,1,2"},
		{"thinker only too small", []int{0}, LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 1, DecodeReplicas: 1},
			"need 2 devices (prefill 1x1, decode 1x1), have 1: 0"},
		{"empty pool", nil, ok, "need 3 devices (prefill 1x1, decode 1x1, downstream 1), have 0"},
		{"huge request does not overflow", []int{0, 1, 2}, LayoutRequest{TensorParallelSize: 1 << 62, PrefillReplicas: 4, DecodeReplicas: 1},
			"need more than exist (prefill 4x4611686018427387904, decode 1x4611686018427387904), have 3: 0,1,2"},
		{"tp zero", []int{0, 1, 2}, LayoutRequest{PrefillReplicas: 1, DecodeReplicas: 1}, "tensor_parallel_size 0 is below 1"},
		{"no prefill", []int{0, 1, 2}, LayoutRequest{TensorParallelSize: 1, DecodeReplicas: 1}, "prefill replicas 0 is below 1"},
		{"no decode", []int{0, 1, 2}, LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 1}, "decode replicas 0 is below 1"},
		{"negative downstream", []int{0, 1, 2}, LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 1, DecodeReplicas: 1, DownstreamSize: -1}, "downstream size -1 is negative"},
		{"duplicate in pool", []int{0, 1, 1}, ok, "device pool 0,1,1: device 1 listed twice"},
		{"pool too small for the encoders", []int{0, 1, 2, 3}, LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 1, DecodeReplicas: 1, DownstreamSize: 1, EncoderReplicas: 2},
			"need 5 devices (encoder 2x1, prefill 1x1, decode 1x1, downstream 1), have 4: 0,1,2,3"},
		{"negative encoders", []int{0, 1, 2}, LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 1, DecodeReplicas: 1, EncoderReplicas: -1}, "encoder replicas -1 is negative"},
		{"huge encoder request does not overflow", []int{0, 1, 2}, LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 1, DecodeReplicas: 1, EncoderReplicas: 1 << 40, EncoderDevices: 1 << 40},
			"need more than exist (encoder 1099511627776x1099511627776, prefill 1x1, decode 1x1), have 3: 0,1,2"},
		{"negative in pool", []int{0, -1, 2}, ok, "device pool 0,-1,2: device -1 is negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := AllocatePD(tt.pool, tt.req)
			if err == nil || err.Error() != tt.want {
				t.Errorf("AllocatePD error = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestDefaultPool(t *testing.T) {
	tests := []struct {
		name  string
		named []int
		n     int
		want  []int
	}{
		{"nothing named", nil, 3, []int{0, 1, 2}},
		{"named sorted and deduplicated", []int{2, 0, 2}, 2, []int{0, 2}},
		{"extended above the highest", []int{1, 0}, 3, []int{0, 1, 2}},
		{"gaps are not filled", []int{0, 4}, 4, []int{0, 4, 5, 6}},
		{"more named than needed", []int{3, 2, 1, 0}, 2, []int{0, 1, 2, 3}},
		{"negative ids dropped", []int{-1, 1}, 2, []int{1, 2}},
		{"zero wanted", nil, 0, []int{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			named := slices.Clone(tt.named)
			got := DefaultPool(named, tt.n)
			if !slices.Equal(got, tt.want) {
				t.Errorf("DefaultPool(%v, %d) = %v, want %v", tt.named, tt.n, got, tt.want)
			}
			if !slices.Equal(named, tt.named) {
				t.Errorf("DefaultPool changed its input to %v", named)
			}
		})
	}
}

func TestDefaultPoolFeedsAllocatePD(t *testing.T) {
	// The default deploy names devices 0 and 1; PD with TP=1 needs a third.
	req := LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 1, DecodeReplicas: 1, DownstreamSize: 1}
	got, err := AllocatePD(DefaultPool([]int{0, 1, 1}, req.Needed()), req)
	if err != nil {
		t.Fatal(err)
	}
	want := Layout{Prefill: [][]int{{0}}, Decode: [][]int{{1}}, Downstream: []int{2}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("layout = %+v, want %+v", got, want)
	}
}

// A role with pinned devices runs on them, and the others are laid out on
// the pool's remaining devices from its start, as if the pinned role took
// none of the pool.
func TestAllocatePDPinned(t *testing.T) {
	tp2 := LayoutRequest{TensorParallelSize: 2, PrefillReplicas: 1, DecodeReplicas: 1, DownstreamSize: 1, EncoderReplicas: 1}
	tests := []struct {
		name string
		pool []int
		req  LayoutRequest
		want Layout
	}{
		{"encoder pinned past the pool", []int{0, 1, 2, 3, 4}, with(tp2, func(r *LayoutRequest) { r.EncoderPinned = []int{6, 7} }),
			Layout{Encoder: [][]int{{6, 7}}, Prefill: [][]int{{0, 1}}, Decode: [][]int{{2, 3}}, Downstream: []int{4}}},
		{"encoder pinned inside the pool", []int{0, 1, 2, 3, 4, 5, 6, 7}, with(tp2, func(r *LayoutRequest) { r.EncoderPinned = []int{6, 7} }),
			Layout{Encoder: [][]int{{6, 7}}, Prefill: [][]int{{0, 1}}, Decode: [][]int{{2, 3}}, Downstream: []int{4}}},
		{"encoder pinned at the pool's start", []int{0, 1, 2, 3, 4, 5, 6}, with(tp2, func(r *LayoutRequest) { r.EncoderPinned = []int{0, 1} }),
			Layout{Encoder: [][]int{{0, 1}}, Prefill: [][]int{{2, 3}}, Decode: [][]int{{4, 5}}, Downstream: []int{6}}},
		{"two encoder instances split in order", []int{0, 1, 2}, LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 1, DecodeReplicas: 1, DownstreamSize: 1, EncoderReplicas: 2, EncoderDevices: 1, EncoderPinned: []int{9, 8}},
			Layout{Encoder: [][]int{{9}, {8}}, Prefill: [][]int{{0}}, Decode: [][]int{{1}}, Downstream: []int{2}}},
		{"prefill pinned, decode and downstream from the rest", []int{0, 1, 2, 3}, LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 1, DecodeReplicas: 1, DownstreamSize: 1, PrefillPinned: []int{1}},
			Layout{Prefill: [][]int{{1}}, Decode: [][]int{{0}}, Downstream: []int{2}}},
		{"decode pinned", []int{0, 1, 2}, LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 1, DecodeReplicas: 1, DownstreamSize: 1, DecodePinned: []int{0}},
			Layout{Prefill: [][]int{{1}}, Decode: [][]int{{0}}, Downstream: []int{2}}},
		{"every Thinker role pinned", nil, LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 1, DecodeReplicas: 1, EncoderReplicas: 1, EncoderPinned: []int{5}, PrefillPinned: []int{3}, DecodePinned: []int{4}},
			Layout{Encoder: [][]int{{5}}, Prefill: [][]int{{3}}, Decode: [][]int{{4}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pinned := slices.Clone(tt.req.EncoderPinned)
			got, err := AllocatePD(tt.pool, tt.req)
			if err != nil {
				t.Fatalf("AllocatePD: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("AllocatePD = %+v, want %+v", got, tt.want)
			}
			if n := tt.req.Needed(); n != countDevices(got) {
				t.Errorf("Needed = %d, layout uses %d", n, countDevices(got))
			}
			for _, set := range got.Encoder {
				for i := range set {
					set[i] = -1
				}
			}
			if !slices.Equal(tt.req.EncoderPinned, pinned) {
				t.Errorf("writing the layout changed the pinned set to %v", tt.req.EncoderPinned)
			}
		})
	}
}

func with(r LayoutRequest, f func(*LayoutRequest)) LayoutRequest {
	f(&r)
	return r
}

func TestAllocatePDPinnedErrors(t *testing.T) {
	tests := []struct {
		name string
		pool []int
		req  LayoutRequest
		want string
	}{
		{"pinned set too large", []int{0, 1, 2}, LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 1, DecodeReplicas: 1, DownstreamSize: 1, EncoderReplicas: 1, EncoderPinned: []int{6, 7}},
			"devices 6,7 for 1 encoder instance(s) of 1 device(s) each; want 1 device, one per rank of each instance"},
		{"pinned set too small", []int{0, 1, 2}, LayoutRequest{TensorParallelSize: 2, PrefillReplicas: 2, DecodeReplicas: 1, PrefillPinned: []int{4, 5}},
			"devices 4,5 for 2 prefill instance(s) of 2 device(s) each; want 4 devices, one per rank of each instance"},
		{"the pool without the pinned devices is too small", []int{0, 1, 2}, LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 1, DecodeReplicas: 1, DownstreamSize: 1, EncoderReplicas: 1, EncoderPinned: []int{0}},
			"need 3 devices (prefill 1x1, decode 1x1, downstream 1), have 2: 1,2 besides the pinned 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := AllocatePD(tt.pool, tt.req)
			if err == nil || err.Error() != tt.want {
				t.Errorf("AllocatePD error = %v, want %q", err, tt.want)
			}
			var pe *PinnedError
			if strings.HasPrefix(tt.want, "devices") && !errors.As(err, &pe) {
				t.Errorf("error %T is not a *PinnedError", err)
			}
		})
	}
}

// The default pool lays the roles that are not pinned out from the lowest
// device no role pins.
func TestLayoutRequestDefaultPool(t *testing.T) {
	tp2 := LayoutRequest{TensorParallelSize: 2, PrefillReplicas: 1, DecodeReplicas: 1, DownstreamSize: 1, EncoderReplicas: 1}
	tests := []struct {
		name  string
		named []int
		req   LayoutRequest
		want  []int
	}{
		{"nothing pinned", nil, tp2, []int{0, 1, 2, 3, 4, 5, 6}},
		{"encoder pinned high", nil, with(tp2, func(r *LayoutRequest) { r.EncoderPinned = []int{6, 7} }), []int{0, 1, 2, 3, 4}},
		{"encoder pinned low", nil, with(tp2, func(r *LayoutRequest) { r.EncoderPinned = []int{0, 1} }), []int{2, 3, 4, 5, 6}},
		{"encoder pinned among the named devices", []int{0, 1}, with(tp2, func(r *LayoutRequest) { r.EncoderPinned = []int{1, 3} }), []int{0, 2, 4, 5, 6}},
		{"prefill and decode pinned", []int{0}, LayoutRequest{TensorParallelSize: 1, PrefillReplicas: 1, DecodeReplicas: 1, DownstreamSize: 1, PrefillPinned: []int{0}, DecodePinned: []int{1}}, []int{2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.req.DefaultPool(tt.named); !slices.Equal(got, tt.want) {
				t.Errorf("DefaultPool(%v) = %v, want %v", tt.named, got, tt.want)
			}
		})
	}
}
