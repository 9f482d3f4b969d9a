package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// SLO is a per-request service level objective: a request meets it when
// every limit that is set (non-zero) holds. Goodput counts such requests.
type SLO struct {
	TTFT, TPOT, E2E time.Duration
	// TTFP is the audio time to first packet.
	TTFP time.Duration
	// RTF is the audio real-time factor; unitless.
	RTF float64
}

// IsZero reports whether no limit is set: every successful request meets it.
func (s SLO) IsZero() bool { return s == SLO{} }

// NeedsAudio reports whether the SLO limits an audio metric.
func (s SLO) NeedsAudio() bool { return s.TTFP != 0 || s.RTF != 0 }

// String is the SLO in the form ParseSLO reads, or "none".
func (s SLO) String() string {
	var parts []string
	add := func(name string, d time.Duration) {
		if d != 0 {
			parts = append(parts, name+"="+d.String())
		}
	}
	add("ttft", s.TTFT)
	add("tpot", s.TPOT)
	add("e2e", s.E2E)
	add("ttfp", s.TTFP)
	if s.RTF != 0 {
		parts = append(parts, "rtf="+strconv.FormatFloat(s.RTF, 'g', -1, 64))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// MarshalJSON writes the limits in milliseconds (RTF as is); unset limits
// are omitted.
func (s SLO) MarshalJSON() ([]byte, error) {
	var b strings.Builder
	b.WriteByte('{')
	sep := ""
	add := func(key string, v float64) {
		b.WriteString(sep + strconv.Quote(key) + ":" + strconv.FormatFloat(v, 'g', -1, 64))
		sep = ","
	}
	for _, f := range []struct {
		key string
		d   time.Duration
	}{{"ttft_ms", s.TTFT}, {"tpot_ms", s.TPOT}, {"e2e_ms", s.E2E}, {"audio_ttfp_ms", s.TTFP}} {
		if f.d != 0 {
			add(f.key, ms(f.d))
		}
	}
	if s.RTF != 0 {
		add("audio_rtf", s.RTF)
	}
	b.WriteByte('}')
	return []byte(b.String()), nil
}

// UnmarshalJSON reads what MarshalJSON writes.
func (s *SLO) UnmarshalJSON(b []byte) error {
	var m map[string]float64
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("bench: SLO: %w", err)
	}
	d := func(v float64) time.Duration { return time.Duration(math.Round(v * float64(time.Millisecond))) }
	*s = SLO{TTFT: d(m["ttft_ms"]), TPOT: d(m["tpot_ms"]), E2E: d(m["e2e_ms"]), TTFP: d(m["audio_ttfp_ms"]), RTF: m["audio_rtf"]}
	return nil
}

// ParseSLO reads "ttft=200ms,tpot=50ms,e2e=2s": comma-separated key=value
// pairs. Keys are ttft, tpot, e2e (or e2el, vLLM's name), ttfp (audio time to
// first packet) and rtf (audio real-time factor, a plain number). Durations
// take Go units (us, ms, s, m); a bare number is milliseconds, as in vllm
// bench serve's --goodput. An empty string is no SLO.
func ParseSLO(s string) (SLO, error) {
	var out SLO
	s = strings.TrimSpace(s)
	if s == "" {
		return out, nil
	}
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		key, value, ok := strings.Cut(strings.TrimSpace(part), "=")
		key, value = strings.ToLower(strings.TrimSpace(key)), strings.TrimSpace(value)
		if !ok || key == "" || value == "" {
			return SLO{}, fmt.Errorf("slo %q: want key=value, e.g. ttft=200ms", part)
		}
		if key == "e2el" {
			key = "e2e"
		}
		if seen[key] {
			return SLO{}, fmt.Errorf("slo %q: %s given twice", s, key)
		}
		seen[key] = true
		if key == "rtf" {
			v, err := strconv.ParseFloat(value, 64)
			if err != nil || !(v > 0) || math.IsInf(v, 0) {
				return SLO{}, fmt.Errorf("slo rtf=%s: want a positive number", value)
			}
			out.RTF = v
			continue
		}
		d, err := parseLimit(value)
		if err != nil {
			return SLO{}, fmt.Errorf("slo %s=%s: %w", key, value, err)
		}
		switch key {
		case "ttft":
			out.TTFT = d
		case "tpot":
			out.TPOT = d
		case "e2e":
			out.E2E = d
		case "ttfp":
			out.TTFP = d
		default:
			return SLO{}, fmt.Errorf("slo %q: unknown metric %q; want ttft, tpot, e2e, ttfp or rtf", s, key)
		}
	}
	return out, nil
}

// parseLimit reads a positive duration; a bare number is milliseconds.
func parseLimit(v string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if !(f > 0) || math.IsInf(f, 0) {
			return 0, errors.New("want a positive duration")
		}
		return time.Duration(math.Round(f * float64(time.Millisecond))), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("want a duration such as 200ms or 1.5s: %w", err)
	}
	if d <= 0 {
		return 0, errors.New("want a positive duration")
	}
	return d, nil
}

// Meets reports whether a successful request's record meets the SLO. TPOT
// of a one-token answer counts as 0, as in vllm bench serve.
func (s SLO) Meets(r *Record) bool {
	if !r.Success {
		return false
	}
	within := func(limit time.Duration, gotMS float64) bool {
		return limit == 0 || gotMS <= ms(limit)
	}
	if !within(s.TTFT, r.TTFTMS) || !within(s.TPOT, r.TPOTMS) || !within(s.E2E, r.E2EMS) {
		return false
	}
	if s.TTFP != 0 && (r.AudioChunks == 0 || !within(s.TTFP, r.AudioTTFPMS)) {
		return false
	}
	if s.RTF != 0 && (r.AudioChunks == 0 || r.AudioRTF > s.RTF) {
		return false
	}
	return true
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
