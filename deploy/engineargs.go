package deploy

import (
	"fmt"
	"regexp"
	"strings"
)

// argShape is a set of YAML shapes an engine argument accepts.
type argShape uint8

const (
	argInt   argShape = 1 << iota // an integer
	argFloat                      // a number: an integer or a float
	argBool
	argStr
	argList
	argMap
)

// argType is the type of one engine argument, as its Python annotation
// gives it.
type argType struct {
	shapes argShape
	// items is the shape of each item of a list argument; 0 for any.
	items argShape
	// humanInt: vllm serve also takes the integer as "32k" or "128K"
	// (vLLM's human_readable_int).
	humanInt bool
}

var (
	tInt      = argType{shapes: argInt}
	tFloat    = argType{shapes: argFloat}
	tBool     = argType{shapes: argBool}
	tStr      = argType{shapes: argStr}
	tMap      = argType{shapes: argMap}
	tIntList  = argType{shapes: argList, items: argInt}
	tStrList  = argType{shapes: argList, items: argStr}
	tHumanInt = argType{shapes: argInt, humanInt: true}
	// tStrOrList is str | list[str].
	tStrOrList = argType{shapes: argStr | argList, items: argStr}
)

// engineArgTypes are the types of the engine arguments a stage may carry:
// the fields of vLLM's EngineArgs (vllm/engine/arg_utils.py at
// vllm-project/vllm 99d7eb5d) and those vllm-omni's OmniEngineArgs adds
// (vllm_omni/engine/arg_utils.py at vllm-project/vllm-omni 0027c20a).
// Literal types (dtype, kv_cache_dtype, quantization, ...) are strings,
// except block_size, a Literal of integers; configuration objects
// (CompilationConfig, EPLBConfig, ...) and dicts are mappings. Arguments
// whose type is Any, and the stage keys omnipd reads itself
// (tensor_parallel_size, data_parallel_size, kv_transfer_config,
// ec_transfer_config, stage_id, model_stage, final_output, async_chunk),
// are not listed. null is accepted for every argument: it leaves the
// argument unset, as vllm-omni's optional deploy fields and omnipd's
// vllm serve rendering both treat it.
var engineArgTypes = map[string]argType{
	// vLLM EngineArgs.
	"model":                                         tStr,
	"served_model_name":                             tStrOrList,
	"tokenizer":                                     tStr,
	"hf_config_path":                                tStr,
	"runner":                                        tStr,
	"convert":                                       tStr,
	"task":                                          tStr,
	"skip_tokenizer_init":                           tBool,
	"enable_prompt_embeds":                          tBool,
	"tokenizer_mode":                                tStr,
	"trust_remote_code":                             tBool,
	"allowed_local_media_path":                      tStr,
	"allowed_media_domains":                         tStrList,
	"download_dir":                                  tStr,
	"safetensors_load_strategy":                     tStr,
	"load_format":                                   tStr,
	"config_format":                                 tStr,
	"dtype":                                         tStr,
	"kv_cache_dtype":                                tStr,
	"seed":                                          tInt,
	"max_model_len":                                 tHumanInt,
	"cuda_graph_sizes":                              tIntList,
	"cudagraph_capture_sizes":                       tIntList,
	"max_cudagraph_capture_size":                    tInt,
	"distributed_executor_backend":                  tStr,
	"pipeline_parallel_size":                        tInt,
	"decode_context_parallel_size":                  tInt,
	"data_parallel_rank":                            tInt,
	"data_parallel_start_rank":                      tInt,
	"data_parallel_size_local":                      tInt,
	"data_parallel_address":                         tStr,
	"data_parallel_rpc_port":                        tInt,
	"data_parallel_hybrid_lb":                       tBool,
	"data_parallel_backend":                         tStr,
	"enable_expert_parallel":                        tBool,
	"all2all_backend":                               tStr,
	"enable_dbo":                                    tBool,
	"dbo_decode_token_threshold":                    tInt,
	"dbo_prefill_token_threshold":                   tInt,
	"disable_nccl_for_dp_synchronization":           tBool,
	"eplb_config":                                   tMap,
	"enable_eplb":                                   tBool,
	"expert_placement_strategy":                     tStr,
	"num_redundant_experts":                         tInt,
	"eplb_window_size":                              tInt,
	"eplb_step_interval":                            tInt,
	"eplb_log_balancedness":                         tBool,
	"max_parallel_loading_workers":                  tInt,
	"block_size":                                    tInt,
	"enable_prefix_caching":                         tBool,
	"prefix_caching_hash_algo":                      tStr,
	"disable_sliding_window":                        tBool,
	"disable_cascade_attn":                          tBool,
	"swap_space":                                    tFloat,
	"cpu_offload_gb":                                tFloat,
	"gpu_memory_utilization":                        tFloat,
	"kv_cache_memory_bytes":                         tHumanInt,
	"max_num_batched_tokens":                        tHumanInt,
	"max_num_partial_prefills":                      tInt,
	"max_long_partial_prefills":                     tInt,
	"long_prefill_token_threshold":                  tInt,
	"max_num_seqs":                                  tInt,
	"max_logprobs":                                  tInt,
	"logprobs_mode":                                 tStr,
	"disable_log_stats":                             tBool,
	"aggregate_engine_logging":                      tBool,
	"revision":                                      tStr,
	"code_revision":                                 tStr,
	"rope_scaling":                                  tMap,
	"rope_theta":                                    tFloat,
	"hf_token":                                      {shapes: argBool | argStr},
	"hf_overrides":                                  tMap,
	"tokenizer_revision":                            tStr,
	"quantization":                                  tStr,
	"enforce_eager":                                 tBool,
	"disable_custom_all_reduce":                     tBool,
	"limit_mm_per_prompt":                           tMap,
	"enable_mm_embeds":                              tBool,
	"interleave_mm_strings":                         tBool,
	"media_io_kwargs":                               tMap,
	"mm_processor_kwargs":                           tMap,
	"disable_mm_preprocessor_cache":                 tBool,
	"mm_processor_cache_gb":                         tFloat,
	"mm_processor_cache_type":                       tStr,
	"mm_shm_cache_max_object_size_mb":               tInt,
	"mm_encoder_tp_mode":                            tStr,
	"mm_encoder_attn_backend":                       tStr,
	"io_processor_plugin":                           tStr,
	"skip_mm_profiling":                             tBool,
	"video_pruning_rate":                            tFloat,
	"enable_lora":                                   tBool,
	"max_loras":                                     tInt,
	"max_lora_rank":                                 tInt,
	"default_mm_loras":                              tMap,
	"fully_sharded_loras":                           tBool,
	"max_cpu_loras":                                 tInt,
	"lora_dtype":                                    tStr,
	"lora_extra_vocab_size":                         tInt,
	"ray_workers_use_nsight":                        tBool,
	"num_gpu_blocks_override":                       tInt,
	"num_lookahead_slots":                           tInt,
	"model_loader_extra_config":                     tMap,
	"ignore_patterns":                               tStrOrList,
	"enable_chunked_prefill":                        tBool,
	"disable_chunked_mm_input":                      tBool,
	"disable_hybrid_kv_cache_manager":               tBool,
	"structured_outputs_config":                     tMap,
	"reasoning_parser":                              tStr,
	"guided_decoding_backend":                       tStr,
	"guided_decoding_disable_fallback":              tBool,
	"guided_decoding_disable_any_whitespace":        tBool,
	"guided_decoding_disable_additional_properties": tBool,
	"logits_processor_pattern":                      tStr,
	"speculative_config":                            tMap,
	"show_hidden_metrics_for_version":               tStr,
	"otlp_traces_endpoint":                          tStr,
	"collect_detailed_traces":                       tStrList,
	"scheduling_policy":                             tStr,
	"scheduler_cls":                                 tStr,
	"pooler_config":                                 tMap,
	"override_pooler_config":                        tMap,
	"compilation_config":                            tMap,
	"worker_cls":                                    tStr,
	"worker_extension_cls":                          tStr,
	"kv_events_config":                              tMap,
	"generation_config":                             tStr,
	"enable_sleep_mode":                             tBool,
	"override_generation_config":                    tMap,
	"model_impl":                                    tStr,
	"override_attention_dtype":                      tStr,
	"calculate_kv_scales":                           tBool,
	"mamba_cache_dtype":                             tStr,
	"mamba_ssm_cache_dtype":                         tStr,
	"mamba_block_size":                              tInt,
	"additional_config":                             tMap,
	"use_tqdm_on_load":                              tBool,
	// Annotated str, but LoadConfig takes a {from: to} mapping too.
	"pt_load_map_location":                    {shapes: argStr | argMap},
	"enable_multimodal_encoder_data_parallel": tBool,
	"logits_processors":                       tStrList,
	"async_scheduling":                        tBool,
	"kv_sharing_fast_prefill":                 tBool,

	// vllm-omni OmniEngineArgs.
	"model_arch":                           tStr,
	"engine_output_type":                   tStr,
	"hf_config_name":                       tStr,
	"custom_process_next_stage_input_func": tStr,
	"requires_full_payload_input":          tBool,
	"stage_connector_spec":                 tMap,
	"subtalker_sampling_params":            tMap,
	"silence_ban_frames":                   tInt,
	"session_mode":                         tStr,
	"retains_state_across_chunks":          tBool,
	"use_v2_model_runner":                  tBool,
	"supports_native_mrv2_data_plane":      tBool,
	"active_stream_window":                 tInt,
	"duplex_max_sessions":                  tInt,
	"omni_kv_config":                       tMap,
	"force_cutlass_fp8":                    tBool,
	"worker_type":                          tStr,
	"pooling_output_decoder":               tStr,
	"task_type":                            tStr,
	"omni":                                 tBool,
	"request_batch_max_wait_ms":            tFloat,
	"fa_deterministic":                     tBool,
	"omni_master_address":                  tStr,
	"omni_master_port":                     tInt,
	"omni_dp_size_local":                   tInt,
	"omni_lb_policy":                       tStr,
	"omni_heartbeat_timeout":               tFloat,
	"output_modalities":                    tStrList,
	"log_stats":                            tBool,
	"custom_pipeline_args":                 tMap,
	"has_sampling_extra_args":              tBool,
	"sampling_extra_args_keys":             tStrList,
}

// humanReadableInt is vLLM's human_readable_int form: a number and a
// decimal (k, m, g) or binary (K, M, G) multiplier.
var humanReadableInt = regexp.MustCompile(`^\d+(\.\d+)?[kKmMgGtT]$`)

// engineArg checks the value of an engine argument against the type vLLM
// or vllm-omni gives it. An argument without a known type is passed on as
// written.
func (p *problems) engineArg(key string, v *Node, path string) {
	t, ok := engineArgTypes[key]
	if !ok || v.Kind == KindNull {
		return
	}
	if t.fits(v) {
		if v.Kind == KindSeq && t.items != 0 {
			for i, it := range v.Items {
				if !shapeFits(t.items, it) {
					p.errorf(it, writtenPath(it, fmt.Sprintf("%s[%d]", path, i)), "%s; want %s", valueIs(it), shapeWant(t.items, 0))
				}
			}
		}
		return
	}
	p.errorf(v, path, "%s; want %s", valueIs(v), shapeWant(t.shapes, t.items))
}

func (t argType) fits(v *Node) bool {
	if shapeFits(t.shapes, v) {
		return true
	}
	return t.humanInt && v.Kind == KindScalar && v.Tag == "!!str" && humanReadableInt.MatchString(strings.TrimSpace(v.Value))
}

func shapeFits(s argShape, v *Node) bool {
	switch v.Kind {
	case KindNull:
		return true
	case KindMap:
		return s&argMap != 0
	case KindSeq:
		return s&argList != 0
	}
	switch v.Tag {
	case "!!int":
		return s&(argInt|argFloat) != 0
	case "!!float":
		return s&argFloat != 0
	case "!!bool":
		return s&argBool != 0
	}
	return s&argStr != 0
}

// shapeWant names what an argument takes: "an integer", "true or false,
// or a string", "a list of integers".
func shapeWant(s, items argShape) string {
	var parts []string
	for _, c := range []struct {
		shape argShape
		name  string
	}{
		{argInt, "an integer"}, {argFloat, "a number"}, {argBool, "true or false"},
		{argStr, "a string"}, {argList, "a list"}, {argMap, "a mapping"},
	} {
		if s&c.shape == 0 {
			continue
		}
		name := c.name
		if c.shape == argList && items != 0 {
			name = "a list of " + strings.TrimPrefix(strings.TrimPrefix(shapeWant(items, 0), "an "), "a ") + "s"
		}
		parts = append(parts, name)
	}
	switch {
	case len(parts) == 2 && strings.Contains(parts[0], " or "):
		return parts[0] + ", or " + parts[1]
	default:
		return strings.Join(parts, " or ")
	}
}

// valueIs says what a value is, for a type error: `"lots" is a string`,
// `1.5 is a number`, `the value is a mapping`.
func valueIs(n *Node) string {
	if n.Kind != KindScalar {
		return "the value is " + n.Kind.String()
	}
	v := n.Value
	if len(v) > 40 {
		v = v[:40] + "…"
	}
	switch n.Tag {
	case "!!int":
		return v + " is an integer"
	case "!!float":
		return v + " is a number"
	case "!!bool":
		return v + " is a boolean"
	}
	return fmt.Sprintf("%q is a string", v)
}
