package topology

import (
	"errors"
	"fmt"
	"math"
	"slices"
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
}

// encoderDevices is how many devices one encoder instance takes.
func (r LayoutRequest) encoderDevices() int {
	if r.EncoderDevices > 0 {
		return r.EncoderDevices
	}
	return r.TensorParallelSize
}

// Needed returns the number of devices req uses. It is only meaningful for
// a request AllocatePD would accept.
func (r LayoutRequest) Needed() int {
	return r.encoderDevices()*r.EncoderReplicas + r.TensorParallelSize*(r.PrefillReplicas+r.DecodeReplicas) + r.DownstreamSize
}

// AllocatePD places encoder replicas first (when there are any), then
// prefill replicas, then decode replicas, then the downstream set, taking
// devices from pool in order. Taking them in order keeps the plan
// predictable: the basic TP=1 layout is prefill 0, decode 1, Talker and
// Code2Wav 2, as vllm-omni documents it (with one encoder: encoder 0,
// prefill 1, decode 2, Talker and Code2Wav 3), and the Thinker's roles get
// disjoint devices as Validate requires.
//
// The returned sets never alias pool.
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
	if need, ok := req.neededChecked(); !ok || need > len(pool) {
		return Layout{}, tooFew(pool, req)
	}
	var l Layout
	next := 0
	take := func(k int) []int {
		set := slices.Clone(pool[next : next+k])
		next += k
		return set
	}
	for range req.EncoderReplicas {
		l.Encoder = append(l.Encoder, take(req.encoderDevices()))
	}
	for range req.PrefillReplicas {
		l.Prefill = append(l.Prefill, take(req.TensorParallelSize))
	}
	for range req.DecodeReplicas {
		l.Decode = append(l.Decode, take(req.TensorParallelSize))
	}
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

func tooFew(pool []int, req LayoutRequest) error {
	count := "more than exist"
	if n, ok := req.neededChecked(); ok {
		count = fmt.Sprintf("%d devices", n)
	}
	need := fmt.Sprintf("need %s (", count)
	if req.EncoderReplicas > 0 {
		need += fmt.Sprintf("encoder %dx%d, ", req.EncoderReplicas, req.encoderDevices())
	}
	need += fmt.Sprintf("prefill %dx%d, decode %dx%d",
		req.PrefillReplicas, req.TensorParallelSize, req.DecodeReplicas, req.TensorParallelSize)
	if req.DownstreamSize > 0 {
		need += fmt.Sprintf(", downstream %d", req.DownstreamSize)
	}
	if len(pool) == 0 {
		return errors.New(need + "), have 0")
	}
	return fmt.Errorf("%s), have %d: %s", need, len(pool), FormatDevices(pool))
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
	pool := make([]int, 0, len(named))
	for _, d := range named {
		if d >= 0 {
			pool = append(pool, d)
		}
	}
	slices.Sort(pool)
	pool = slices.Compact(pool)
	next := 0
	if len(pool) > 0 {
		next = pool[len(pool)-1] + 1
	}
	for len(pool) < n {
		pool = append(pool, next)
		next++
	}
	return pool
}
