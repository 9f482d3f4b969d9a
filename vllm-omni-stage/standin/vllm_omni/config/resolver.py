"""Stand-in for vllm_omni/config/resolver.py
(@0734a2960e96694530be23e15fcc3f50a7313974): ``resolve_omni_config`` and
``OmniConfigResolution``.

The model ``standin-model`` resolves to the toy Qwen3-Omni pipeline of
vllm-omni's registry (vllm_omni/model_executor/models/qwen3_omni/pipeline.py):
stage 0 Thinker, 1 Talker, 2 Code2Wav. The deploy YAML overlays it as
vllm-omni's deploy schema does: per ``stage_id``, ``devices`` into the
runtime, ``default_sampling_params`` merged, connectors and platform
sections not engine arguments, every other key an engine argument. Stages
come back as plain dicts (upstream: OmegaConf configs of the same keys).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Mapping

from vllm_omni import _toy

STANDIN_MODEL = "standin-model"

_PROCESSORS = "vllm_omni.model_executor.stage_input_processors.qwen3_omni"

_PIPELINE: tuple[dict[str, Any], ...] = (
    {"stage_id": 0, "stage_type": "llm", "engine_input_source": [], "final_output": True,
     "final_output_type": "text", "is_comprehension": True,
     "engine_args": {"model_stage": "thinker", "model_arch": "Qwen3OmniMoeForConditionalGeneration",
                     "worker_type": "ar", "engine_output_type": "latent", "max_model_len": 4096},
     "default_sampling_params": {"temperature": 0.0, "max_tokens": 2048}, "runtime": {"devices": "0"}},
    {"stage_id": 1, "stage_type": "llm", "engine_input_source": [0], "final_output": False,
     "final_output_type": "latent", "custom_process_input_func": f"{_PROCESSORS}.thinker2talker",
     "engine_args": {"model_stage": "talker", "model_arch": "Qwen3OmniMoeForConditionalGeneration",
                     "worker_type": "ar", "engine_output_type": "latent", "max_model_len": 8192},
     "default_sampling_params": {"temperature": 0.9, "top_k": 50, "max_tokens": 4096,
                                 "stop_token_ids": [_toy.CODEC_STOP], "detokenize": False},
     "runtime": {"devices": "1"}},
    {"stage_id": 2, "stage_type": "llm", "engine_input_source": [1], "final_output": True,
     "final_output_type": "audio", "custom_process_input_func": f"{_PROCESSORS}.talker2code2wav",
     "engine_args": {"model_stage": "code2wav", "model_arch": "Qwen3OmniMoeForConditionalGeneration",
                     "worker_type": "generation", "engine_output_type": "audio", "max_model_len": 65536},
     "default_sampling_params": {"temperature": 0.0, "max_tokens": 65536, "detokenize": False},
     "runtime": {"devices": "1"}},
)

_NOT_ENGINE_ARGS = {"stage_id", "devices", "default_sampling_params", "input_connectors", "output_connectors",
                    "num_replicas", "env"}


@dataclass(frozen=True)
class OmniConfigResolution:
    config_path: str | None
    stage_configs: tuple[Any, ...]
    omni_lb_policy: str | None = None
    endpoint_restrictions: tuple[Any, ...] = ()

    def stage_by_id(self, stage_id: int) -> Any:
        for stage in self.stage_configs:
            if stage["stage_id"] == stage_id:
                return stage
        raise KeyError(f"no stage {stage_id}")


def resolve_omni_config(
    model: str,
    *,
    trust_remote_code: bool,
    deploy_config_path: str | None,
    cli_overrides: Mapping[str, Any] | None,
    stage_overrides: Mapping[str, Mapping[str, Any]] | None,
    strategy_config_path: str | None,
) -> OmniConfigResolution:
    if model != STANDIN_MODEL:
        raise ValueError(f"Model {model!r} did not resolve to a registered Omni pipeline or a supported "
                         "diffusion model.")
    stages = [copy.deepcopy(s) for s in _PIPELINE]
    if deploy_config_path:
        with open(deploy_config_path) as f:
            deploy = _toy.load_yaml(f.read()) or {}
        if not isinstance(deploy, dict):
            raise ValueError(f"{deploy_config_path}: not a mapping")
        if "stage_args" in deploy:
            raise ValueError(f"{deploy_config_path}: the legacy stage_args schema is no longer supported; "
                             "write stages:")
        # The top-level async_chunk reaches every stage's engine arguments,
        # a stage's own key overriding it, as vllm-omni's resolver writes it
        # (vllm_omni/config/stage_config.py@0342827dd787296b8a6b1e9f523ebaa24d13c714).
        if "async_chunk" in deploy:
            for s in stages:
                s["engine_args"]["async_chunk"] = deploy["async_chunk"]
        for entry in deploy.get("stages") or []:
            sid = entry.get("stage_id")
            if not isinstance(sid, int) or not 0 <= sid < len(stages):
                raise ValueError(f"{deploy_config_path}: stages[].stage_id {sid!r} is not a stage of the pipeline")
            _overlay(stages[sid], entry)
    for sid, overrides in (stage_overrides or {}).items():
        for s in stages:  # upstream flattens them to stage_<id>_<key>: an unknown stage matches none
            if str(s["stage_id"]) == str(sid):
                s["engine_args"].update(dict(overrides))
    for k, v in (cli_overrides or {}).items():
        for s in stages:
            s["engine_args"][k] = v
    return OmniConfigResolution(config_path=deploy_config_path, stage_configs=tuple(stages))


def _overlay(stage: dict[str, Any], entry: Mapping[str, Any]) -> None:
    if "devices" in entry:
        stage["runtime"]["devices"] = str(entry["devices"])
    if isinstance(entry.get("default_sampling_params"), dict):
        stage["default_sampling_params"].update(entry["default_sampling_params"])
    for k, v in entry.items():
        if k not in _NOT_ENGINE_ARGS:
            stage["engine_args"][k] = v


_toy.drop_interfaces(globals(), __name__)
