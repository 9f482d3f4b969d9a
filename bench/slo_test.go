package bench

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestParseSLO(t *testing.T) {
	tests := []struct {
		in   string
		want SLO
	}{
		{"", SLO{}},
		{"ttft=200ms,tpot=50ms,e2e=2s", SLO{TTFT: 200 * time.Millisecond, TPOT: 50 * time.Millisecond, E2E: 2 * time.Second}},
		{"ttft=200", SLO{TTFT: 200 * time.Millisecond}}, // bare numbers are milliseconds
		{" TTFT = 12.5 , e2el=1.5s ", SLO{TTFT: 12500 * time.Microsecond, E2E: 1500 * time.Millisecond}},
		{"ttfp=300,rtf=0.8", SLO{TTFP: 300 * time.Millisecond, RTF: 0.8}},
		{"tpot=750us", SLO{TPOT: 750 * time.Microsecond}},
	}
	for _, tt := range tests {
		got, err := ParseSLO(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseSLO(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
	for in, wantErr := range map[string]string{
		"ttft":               "key=value",
		"ttft=":              "key=value",
		"ttft=fast":          "duration",
		"ttft=-5":            "positive",
		"tpot=0ms":           "positive",
		"latency=5ms":        "unknown metric",
		"ttft=1,ttft=2":      "twice",
		"rtf=0":              "positive number",
		"rtf=1s":             "positive number",
		"ttft=200ms;tpot=50": "duration",
	} {
		if _, err := ParseSLO(in); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("ParseSLO(%q) error %v; want one mentioning %q", in, err, wantErr)
		}
	}
}

func TestSLOMeets(t *testing.T) {
	slo := SLO{TTFT: 100 * time.Millisecond, TPOT: 10 * time.Millisecond}
	ok := Record{Success: true, TTFTMS: 100, TPOTMS: 9.5, E2EMS: 5000}
	if !slo.Meets(&ok) {
		t.Error("a request at the limit misses the SLO")
	}
	for name, r := range map[string]Record{
		"slow first token": {Success: true, TTFTMS: 100.1, TPOTMS: 1},
		"slow tokens":      {Success: true, TTFTMS: 1, TPOTMS: 10.5},
		"failed":           {TTFTMS: 1, TPOTMS: 1},
	} {
		if slo.Meets(&r) {
			t.Errorf("%s: meets the SLO", name)
		}
	}
	if !(SLO{}).Meets(&ok) {
		t.Error("no SLO: a completed request must count as good")
	}
	audio := SLO{TTFP: 300 * time.Millisecond, RTF: 1}
	if audio.Meets(&Record{Success: true}) {
		t.Error("an audio SLO is met by a request without audio")
	}
	if !audio.Meets(&Record{Success: true, AudioChunks: 2, AudioTTFPMS: 250, AudioRTF: 0.4}) {
		t.Error("audio within limits misses the SLO")
	}
	if audio.Meets(&Record{Success: true, AudioChunks: 2, AudioTTFPMS: 250, AudioRTF: 1.2}) {
		t.Error("audio slower than real time meets rtf=1")
	}
}

func TestSLOJSONRoundTrip(t *testing.T) {
	for _, s := range []SLO{{}, {TTFT: 200 * time.Millisecond, E2E: 1500 * time.Millisecond, RTF: 0.5}, {TPOT: 750 * time.Microsecond, TTFP: time.Second}} {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var back SLO
		if err := json.Unmarshal(b, &back); err != nil || back != s {
			t.Errorf("%s -> %+v, %v; want %+v", b, back, err, s)
		}
		if again, _ := ParseSLO(strings.ReplaceAll(s.String(), "none", "")); again != s {
			t.Errorf("ParseSLO(%q) = %+v; want %+v", s.String(), again, s)
		}
	}
	b, _ := json.Marshal(SLO{TTFT: 200 * time.Millisecond})
	if string(b) != `{"ttft_ms":200}` {
		t.Errorf("JSON %s", b)
	}
}
