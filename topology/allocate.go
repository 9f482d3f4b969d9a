package topology

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Layout is the device plan for a disaggregated Thinker plus its downstream stages.
type Layout struct {
	Encoder    [][]int // one device set per encoder replica; nil without an encoder stage
	Prefill    [][]int // one device set per prefill replica
	Decode     [][]int // one device set per decode replica
	Downstream []int   // the set shared by the downstream stages (Talker and Code2Wav); nil when DownstreamSize == 0
}

// LayoutRequest says what to place.
type LayoutRequest struct {
	TensorParallelSize int // of prefill and decode (equal)
	PrefillReplicas    int
	DecodeReplicas     int
	DownstreamSize     int // devices the downstream stages share; 0 when the pipeline is thinker-only
	// EncoderReplicas is the number of encoder instances (E/P/D); 0 for
	// none. Each takes EncoderDevices devices, TensorParallelSize when 0.
	EncoderReplicas int
	EncoderDevices  int
	// EncoderPinned, PrefillPinned and DecodePinned are the devices the
	// config gives that role itself; nil lets the layout choose. A pinned
	// role runs on exactly its devices, split among its replicas in order,
	// and the pool lays out the other roles on the devices no role pins.
	EncoderPinned, PrefillPinned, DecodePinned []int
}

// PinnedError is a pinned device set that does not fit its role: its size
// must be the role's replicas times the devices one instance uses.
type PinnedError struct {
	Role        Role
	Devices     []int
	Replicas    int
	PerInstance int
}

func (e *PinnedError) Error() string {
	want := "more than exist"
	if e.PerInstance > 0 && e.Replicas <= math.MaxInt/e.PerInstance {
		want = strconv.Itoa(e.Replicas*e.PerInstance) + " devices"
		if e.Replicas*e.PerInstance == 1 {
			want = "1 device"
		}
	}
	return fmt.Sprintf("%s for %d %s instance(s) of %d device(s) each; want %s, one per rank of each instance",
		devs(e.Devices), e.Replicas, e.Role, e.PerInstance, want)
}

// roleRequest is one Thinker role of a request: its pinned set, replica
// count and devices per instance.
type roleRequest struct {
	role     Role
	pinned   []int
	replicas int
	per      int
}

func (r LayoutRequest) roles() []roleRequest {
	return []roleRequest{
		{RoleEncoder, r.EncoderPinned, r.EncoderReplicas, r.encoderDevices()},
		{RolePrefill, r.PrefillPinned, r.PrefillReplicas, r.TensorParallelSize},
		{RoleDecode, r.DecodePinned, r.DecodeReplicas, r.TensorParallelSize},
	}
}

// fits is whether the role's pinned set (when it has one) is exactly its
// replicas' devices; division, not multiplication, so that absurd sizes
// cannot wrap around.
func (r roleRequest) fits() bool {
	return r.pinned == nil || r.replicas >= 1 && r.per >= 1 && len(r.pinned)%r.per == 0 && len(r.pinned)/r.per == r.replicas
}

// pinnedDevices is every device a role pins.
func (r LayoutRequest) pinnedDevices() []int {
	return slices.Concat(r.EncoderPinned, r.PrefillPinned, r.DecodePinned)
}

// fromPool is the request without its pinned roles: what the pool must hold.
func (r LayoutRequest) fromPool() LayoutRequest {
	if r.EncoderPinned != nil {
		r.EncoderReplicas = 0
	}
	if r.PrefillPinned != nil {
		r.PrefillReplicas = 0
	}
	if r.DecodePinned != nil {
		r.DecodeReplicas = 0
	}
	r.EncoderPinned, r.PrefillPinned, r.DecodePinned = nil, nil, nil
	return r
}

// encoderDevices is how many devices one encoder instance takes.
func (r LayoutRequest) encoderDevices() int {
	if r.EncoderDevices > 0 {
		return r.EncoderDevices
	}
	return r.TensorParallelSize
}

// Needed returns the number of devices req uses, pinned ones included. It
// is only meaningful for a request AllocatePD would accept.
func (r LayoutRequest) Needed() int {
	return r.encoderDevices()*r.EncoderReplicas + r.TensorParallelSize*(r.PrefillReplicas+r.DecodeReplicas) + r.DownstreamSize
}

// DefaultPool is the pool AllocatePD lays req out on when the user names
// none: DefaultPool of the named devices for what req does not pin, never
// holding a pinned device. Pinning the encoder to 6,7 so leaves the layout
// to start at 0, not after the encoder.
func (r LayoutRequest) DefaultPool(named []int) []int {
	return defaultPool(named, r.pinnedDevices(), r.fromPool().Needed())
}

// AllocatePD places encoder replicas first (when there are any), then
// prefill replicas, then decode replicas, then the downstream set, taking
// devices from pool in order. Taking them in order keeps the plan
// predictable: the basic TP=1 layout is prefill 0, decode 1, Talker and
// Code2Wav 2, as vllm-omni documents it (with one encoder: encoder 0,
// prefill 1, decode 2, Talker and Code2Wav 3), and the Thinker's roles get
// disjoint devices as Validate requires. A role with pinned devices runs on
// them and takes nothing from the pool; the others take the pool's devices
// that no role pins, in the same order.
//
// The returned sets never alias pool or the pinned sets.
func AllocatePD(pool []int, req LayoutRequest) (Layout, error) {
	switch {
	case req.TensorParallelSize < 1:
		return Layout{}, fmt.Errorf("tensor_parallel_size %d is below 1", req.TensorParallelSize)
	case req.PrefillReplicas < 1:
		return Layout{}, fmt.Errorf("prefill replicas %d is below 1", req.PrefillReplicas)
	case req.DecodeReplicas < 1:
		return Layout{}, fmt.Errorf("decode replicas %d is below 1", req.DecodeReplicas)
	case req.DownstreamSize < 0:
		return Layout{}, fmt.Errorf("downstream size %d is negative", req.DownstreamSize)
	case req.EncoderReplicas < 0:
		return Layout{}, fmt.Errorf("encoder replicas %d is negative", req.EncoderReplicas)
	case req.EncoderDevices < 0:
		return Layout{}, fmt.Errorf("encoder devices %d is negative", req.EncoderDevices)
	}
	if err := checkPool(pool); err != nil {
		return Layout{}, err
	}
	for _, r := range req.roles() {
		if !r.fits() {
			return Layout{}, &PinnedError{Role: r.role, Devices: slices.Clone(r.pinned), Replicas: r.replicas, PerInstance: r.per}
		}
	}
	pinned := req.pinnedDevices()
	free := slices.DeleteFunc(slices.Clone(pool), func(d int) bool { return slices.Contains(pinned, d) })
	rest := req.fromPool()
	if need, ok := rest.neededChecked(); !ok || need > len(free) {
		return Layout{}, tooFew(free, rest, pinned)
	}
	var l Layout
	next := 0
	take := func(k int) []int {
		set := slices.Clone(free[next : next+k])
		next += k
		return set
	}
	place := func(pinned []int, replicas, per int) [][]int {
		var sets [][]int
		for i := range replicas {
			if pinned != nil {
				sets = append(sets, slices.Clone(pinned[i*per:(i+1)*per]))
			} else {
				sets = append(sets, take(per))
			}
		}
		return sets
	}
	l.Encoder = place(req.EncoderPinned, req.EncoderReplicas, req.encoderDevices())
	l.Prefill = place(req.PrefillPinned, req.PrefillReplicas, req.TensorParallelSize)
	l.Decode = place(req.DecodePinned, req.DecodeReplicas, req.TensorParallelSize)
	if req.DownstreamSize > 0 {
		l.Downstream = take(req.DownstreamSize)
	}
	return l, nil
}

// neededChecked is Needed for non-negative fields, with ok false when the
// count does not fit in an int, so absurd requests cannot wrap around into a
// small number that a pool appears to satisfy.
func (r LayoutRequest) neededChecked() (n int, ok bool) {
	if r.PrefillReplicas > math.MaxInt-r.DecodeReplicas {
		return 0, false
	}
	reps := r.PrefillReplicas + r.DecodeReplicas
	if reps > 0 && r.TensorParallelSize > math.MaxInt/reps {
		return 0, false
	}
	thinker := r.TensorParallelSize * reps
	if thinker > math.MaxInt-r.DownstreamSize {
		return 0, false
	}
	n = thinker + r.DownstreamSize
	if e := r.encoderDevices(); r.EncoderReplicas > 0 {
		if e > math.MaxInt/r.EncoderReplicas || e*r.EncoderReplicas > math.MaxInt-n {
			return 0, false
		}
		n += e * r.EncoderReplicas
	}
	return n, true
}

// tooFew says the pool cannot hold req (the roles it lays out); pinned
// are the devices set aside for the pinned roles.
func tooFew(pool []int, req LayoutRequest, pinned []int) error {
	count := "more than exist"
	if n, ok := req.neededChecked(); ok {
		count = fmt.Sprintf("%d devices", n)
	}
	var parts []string
	if req.EncoderReplicas > 0 {
		parts = append(parts, fmt.Sprintf("encoder %dx%d", req.EncoderReplicas, req.encoderDevices()))
	}
	if req.PrefillReplicas > 0 {
		parts = append(parts, fmt.Sprintf("prefill %dx%d", req.PrefillReplicas, req.TensorParallelSize))
	}
	if req.DecodeReplicas > 0 {
		parts = append(parts, fmt.Sprintf("decode %dx%d", req.DecodeReplicas, req.TensorParallelSize))
	}
	if req.DownstreamSize > 0 {
		parts = append(parts, fmt.Sprintf("downstream %d", req.DownstreamSize))
	}
	need := fmt.Sprintf("need %s (%s)", count, strings.Join(parts, ", "))
	have := "have 0"
	if len(pool) > 0 {
		have = fmt.Sprintf("have %d: %s", len(pool), FormatDevices(pool))
	}
	if len(pinned) > 0 {
		have += fmt.Sprintf(" besides the pinned %s", FormatDevices(pinned))
	}
	return errors.New(need + ", " + have)
}

// checkPool rejects pools that would hand one device to two engines or name
// a device that cannot exist.
func checkPool(pool []int) error {
	for i, d := range pool {
		if d < 0 {
			return fmt.Errorf("device pool %s: device %d is negative", FormatDevices(pool), d)
		}
		if slices.Contains(pool[:i], d) {
			return fmt.Errorf("device pool %s: device %d listed twice", FormatDevices(pool), d)
		}
	}
	return nil
}

// DefaultPool returns the pool used when the user names none: the devices
// already named by the config (in ascending order, duplicates removed),
// extended with the next higher ids until it has n devices. Starting from the
// named devices keeps an expanded config on the hardware the user already
// chose; going upward past them avoids guessing at gaps the user may have
// left on purpose. Negative ids are dropped because no device has one. When
// the config names more than n devices, all of them are returned.
func DefaultPool(named []int, n int) []int {
	return defaultPool(named, nil, n)
}

// defaultPool is DefaultPool without the devices in avoid, neither named
// nor added.
func defaultPool(named, avoid []int, n int) []int {
	pool := make([]int, 0, len(named))
	for _, d := range named {
		if d >= 0 && !slices.Contains(avoid, d) {
			pool = append(pool, d)
		}
	}
	slices.Sort(pool)
	pool = slices.Compact(pool)
	next := 0
	if len(pool) > 0 {
		next = pool[len(pool)-1] + 1
	}
	for len(pool) < n && next <= MaxDeviceID {
		if !slices.Contains(avoid, next) {
			pool = append(pool, next)
		}
		next++
	}
	return pool
}
