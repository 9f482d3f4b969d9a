package stageclient

import (
	"errors"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
)

func TestHealth(t *testing.T) {
	status := http.StatusOK
	c := serve(t, Config{Secret: "k"}, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/health" || r.Header.Get("Authorization") != "Bearer k" {
			t.Errorf("got %s %s %v", r.Method, r.URL.Path, r.Header)
		}
		w.WriteHeader(status)
	})
	if err := c.Health(testCtx(t)); err != nil {
		t.Fatalf("healthy: %v", err)
	}
	status = http.StatusServiceUnavailable // vLLM, once its engine died
	err := c.Health(testCtx(t))
	var ue *UpstreamError
	if !errors.As(err, &ue) || ue.Status != http.StatusServiceUnavailable || !ue.Retryable() {
		t.Fatalf("dead engine: %v", err)
	}
}

// vllmMetrics is an exposition as vLLM's prometheus_client writes it (two
// data-parallel engines), with a few lines from other exporters for the
// corners of the format: escapes, timestamps, unsorted labels, +Inf, NaN.
const vllmMetrics = `# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 15234.0
python_gc_objects_collected_total{generation="1"} 3012.0
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.75400871537e+09
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-Omni-30B-A3B-Instruct"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-Omni-30B-A3B-Instruct"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-Omni-30B-A3B-Instruct"} 0.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-Omni-30B-A3B-Instruct"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-Omni-30B-A3B-Instruct"} 0.4213
# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="Qwen/Qwen3-Omni-30B-A3B-Instruct",source="external_kv_transfer"} 81920.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="Qwen/Qwen3-Omni-30B-A3B-Instruct",source="local_compute"} 17.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-Omni-30B-A3B-Instruct"} 3.5199999999999996
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-Omni-30B-A3B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="Qwen/Qwen3-Omni-30B-A3B-Instruct"} 15.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-Omni-30B-A3B-Instruct"} 17.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-Omni-30B-A3B-Instruct"} 17.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",prefix_caching_hash_algo="sha256",num_gpu_blocks="None"} 1.0
# some exporters write timestamps, spaces, escapes and labels out of order
http_requests_total{method="post",code="200"} 1027 1395066363000
  msdos_file_access_time_seconds{path="C:\\DIR\\FILE.TXT",error="Cannot find file:\n\"FILE.TXT\""} 1.458255915e9
something_weird{problem="division by zero"} +Inf
nan_gauge NaN
negative_inf -Inf
trailing_comma{a="1",} 7
spaced { b = "x" , a = "y" } 8
`

func TestMetrics(t *testing.T) {
	c := serve(t, Config{}, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" || !strings.HasPrefix(r.Header.Get("Accept"), "text/plain") {
			t.Errorf("got %s, Accept %q", r.URL.Path, r.Header.Get("Accept"))
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = io.WriteString(w, strings.Replace(vllmMetrics, "\n", "\r\n", 3)) // CRLF in the mix
	})
	m, err := c.Metrics(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	const model = `model_name="Qwen/Qwen3-Omni-30B-A3B-Instruct"`
	for key, want := range map[string]float64{
		`python_gc_objects_collected_total{generation="0"}`:                                                                  15234,
		`process_start_time_seconds`:                                                                                         1.75400871537e+09,
		`vllm:num_requests_running{engine="0",` + model + `}`:                                                                3,
		`vllm:num_requests_waiting{engine="1",` + model + `}`:                                                                4,
		`vllm:kv_cache_usage_perc{engine="0",` + model + `}`:                                                                 0.4213,
		`vllm:prompt_tokens_by_source_total{engine="0",` + model + `,source="external_kv_transfer"}`:                         81920,
		`vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",` + model + `}`:                                        17,
		`vllm:time_to_first_token_seconds_sum{engine="0",` + model + `}`:                                                     3.5199999999999996,
		`vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="None",prefix_caching_hash_algo="sha256"}`: 1,
		`http_requests_total{code="200",method="post"}`:                                                                      1027,
		`msdos_file_access_time_seconds{error="Cannot find file:\n\"FILE.TXT\"",path="C:\\DIR\\FILE.TXT"}`:                   1.458255915e9,
		`something_weird{problem="division by zero"}`:                                                                        math.Inf(1),
		`negative_inf`:          math.Inf(-1),
		`trailing_comma{a="1"}`: 7,
		`spaced{a="y",b="x"}`:   8,
	} {
		got, ok := m[key]
		if !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", key, got, ok, want)
		}
	}
	if v, ok := m["nan_gauge"]; !ok || !math.IsNaN(v) {
		t.Errorf("nan_gauge = %v, %v", v, ok)
	}
	if len(m) != 23 {
		t.Errorf("%d series, want 23", len(m))
	}
	for _, tc := range []struct {
		name string
		want float64
		ok   bool
	}{
		{"vllm:num_requests_running", 5, true},
		{"vllm:num_requests_waiting", 4, true},
		{"vllm:num_requests", 0, false}, // a prefix of a name is not the name
		{"process_start_time_seconds", 1.75400871537e+09, true},
		{"vllm:absent", 0, false},
	} {
		if got, ok := SumSeries(m, tc.name); got != tc.want || ok != tc.ok {
			t.Errorf("SumSeries(%s) = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

func TestMetricsErrors(t *testing.T) {
	for _, bad := range []string{
		"no_value\n",
		"dash-name 1\n",
		"labels_no_value{a=\"1\"}\n",
		"bad_value abc\n",
		`unterminated{a="1} 2` + "\n",
		`unquoted{a=1} 2` + "\n",
		`no_comma{a="1" b="2"} 2` + "\n",
		`{a="1"} 2` + "\n",
		"9starts_with_digit 1\n",
		"too many fields 1 2 3\n",
		"bad_timestamp 1 yesterday\n",
		"<html>503</html>\n",
	} {
		if _, err := parseExposition(bad); err == nil {
			t.Errorf("parseExposition(%q) succeeded", bad)
		} else if !strings.Contains(err.Error(), "line 1") {
			t.Errorf("parseExposition(%q): error does not name the line: %v", bad, err)
		}
	}
	m, err := parseExposition("a 1 # {trace_id=\"x\"} 1.0\nb 2 1700000000000 # {} 1\n")
	if err != nil || m["a"] != 1 || m["b"] != 2 {
		t.Errorf("exemplars: %v, %v", m, err)
	}

	status := http.StatusOK
	body := "not metrics at all\n"
	c := serve(t, Config{}, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	})
	_, err = c.Metrics(testCtx(t))
	assertClass(t, "Metrics", err, ErrProtocol)
	status, body = http.StatusNotFound, `{"detail":"Not Found"}`
	_, err = c.Metrics(testCtx(t))
	var ue *UpstreamError
	if !errors.As(err, &ue) || ue.Status != http.StatusNotFound || ue.Body.Detail.Message != "Not Found" {
		t.Errorf("404: %v", err)
	}
	status, body = http.StatusOK, strings.Repeat("x 1\n", maxMetricsBody/4+1)
	_, err = c.Metrics(testCtx(t))
	assertClass(t, "Metrics oversized", err, ErrProtocol)
}

func FuzzParseExposition(f *testing.F) {
	f.Add(vllmMetrics)
	f.Add(`a{b="\\"} 1`)
	f.Add(`a{b="\`)
	f.Fuzz(func(t *testing.T, text string) {
		m, err := parseExposition(text)
		if err == nil && m == nil {
			t.Fatal("nil map without error")
		}
	})
}
