"""Building a single-stage vllm-omni engine for one stage of a pipeline.

The shape Dynamo's omni stage worker uses
(ai-dynamo/dynamo components/src/dynamo/vllm/omni/stage_worker.py,
``_create_engine``; stage_config_compat.py for the resolver): resolve the
pipeline's stage configs from the model and the deploy config, keep the one
stage this worker serves as stage 0 with no input sources and
``final_output: true``, write it as a one-stage deploy config with
``async_chunk: false`` and build ``AsyncOmni(model=..., deploy_config=...)``
from it (vllm_omni/entrypoints/async_omni.py, v0.32.0).

The stage configs come from vllm-omni's public resolver,
``vllm_omni.config.resolver.resolve_omni_config`` (vllm_omni/config/resolver.py
@0734a2960e96694530be23e15fcc3f50a7313974: "the single public entrypoint"),
with this worker's engine flags as the stage's overrides. The one-stage
config is written as JSON, which YAML loaders read as YAML: the worker needs
no YAML library of its own.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

THINKER, TALKER, CODE2WAV = "thinker", "talker", "code2wav"


class StageError(Exception):
    """The deploy config does not give this worker a stage it can serve."""


@dataclass
class StageSpec:
    """The stage this worker serves, as the deploy config resolved it."""

    stage_id: int
    model_stage: str
    stage_type: str
    final_output_type: str
    engine_args: dict[str, Any]
    default_sampling_params: dict[str, Any] = field(default_factory=dict)
    devices: str | None = None


def plain(obj: Any) -> Any:
    """A config value (OmegaConf, dataclass, namespace, mapping) as plain
    Python data."""
    try:
        from omegaconf import OmegaConf  # noqa: PLC0415 - vllm-omni's configs are OmegaConf
    except ImportError:
        OmegaConf = None  # noqa: N806
    if OmegaConf is not None and OmegaConf.is_config(obj):
        return OmegaConf.to_container(obj, resolve=True)
    if isinstance(obj, Mapping):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return {k: plain(v) for k, v in vars(obj).items() if not k.startswith("_")}
    return obj


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def resolve_stage(model: str, deploy_config: str, stage_id: int, overrides: dict[str, Any]) -> StageSpec:
    """The stage stage_id of the pipeline, with overrides applied to its
    engine arguments."""
    from vllm_omni.config.resolver import resolve_omni_config  # noqa: PLC0415

    trust = bool(overrides.get("trust_remote_code", True))
    resolution = resolve_omni_config(
        model,
        trust_remote_code=trust,
        deploy_config_path=deploy_config,
        cli_overrides={},
        stage_overrides={str(stage_id): dict(overrides)},
        strategy_config_path=None,
    )
    stages = list(resolution.stage_configs)
    chosen = None
    for st in stages:
        if int(_get(st, "stage_id", -1)) == stage_id:
            chosen = st
    if chosen is None:
        ids = sorted(int(_get(s, "stage_id", -1)) for s in stages)
        raise StageError(f"--stage-id {stage_id}: {deploy_config} has stages {ids}")
    engine_args = plain(_get(chosen, "engine_args", {})) or {}
    for k, v in overrides.items():  # the worker's flags win, as vllm serve's do
        engine_args[k] = v
    model_stage = str(engine_args.get("model_stage") or _get(chosen, "model_stage", "") or "")
    if model_stage not in (THINKER, TALKER, CODE2WAV):
        raise StageError(f"stage {stage_id} of {deploy_config} is model_stage {model_stage!r}; "
                         f"this worker serves {THINKER}, {TALKER} or {CODE2WAV}")
    runtime = plain(_get(chosen, "runtime", {})) or {}
    devices = runtime.get("devices") if isinstance(runtime, dict) else None
    return StageSpec(
        stage_id=stage_id,
        model_stage=model_stage,
        stage_type=str(_get(chosen, "stage_type", "llm") or "llm"),
        final_output_type=str(_get(chosen, "final_output_type", "text") or "text"),
        engine_args=engine_args,
        default_sampling_params=plain(_get(chosen, "default_sampling_params", {})) or {},
        devices=str(devices) if devices is not None else None,
    )


def streams_talker(spec: StageSpec) -> bool:
    """Whether spec's Talker takes its rows while it runs: the stage's
    ``async_chunk`` engine argument (vllm-omni's resolver writes the deploy
    config's top-level value into every stage, a stage's own key overriding
    it: vllm_omni/config/stage_config.py@0342827dd787296b8a6b1e9f523ebaa24d13c714;
    ``--async-chunk`` / ``--no-async-chunk`` on the worker override both)."""
    v = spec.engine_args.get("async_chunk")
    if isinstance(v, str):
        v = v.strip().lower() in ("1", "true", "yes", "on")
    return spec.model_stage == TALKER and spec.stage_id > 0 and bool(v)


def one_stage_config(spec: StageSpec) -> dict[str, Any]:
    """The deploy config of a pipeline made of spec's stage alone: stage 0,
    no input sources, its output final, no async chunk (it has no peer
    stage to stream to inside this engine). Its devices are renumbered from
    0: the process sees only its own (CUDA_VISIBLE_DEVICES).

    A Talker that streams (``streams_talker``) keeps its pipeline stage id
    and async chunk on: vllm-omni's chunk adapter polls the stage before
    its own and never polls on stage 0
    (vllm_omni/distributed/omni_connectors/transfer_adapter/chunk_transfer_adapter.py
    @0342827dd787296b8a6b1e9f523ebaa24d13c714, ``load_async``); the worker
    writes that stage's chunks itself (talker_feed.py)."""
    streaming = streams_talker(spec)
    stage: dict[str, Any] = dict(spec.engine_args)
    stage.update({
        "stage_id": spec.stage_id if streaming else 0,
        "model_stage": spec.model_stage,
        "stage_type": spec.stage_type,
        "engine_input_source": [],
        "final_output": True,
        "final_output_type": spec.final_output_type,
        "default_sampling_params": spec.default_sampling_params,
    })
    if spec.devices:
        count = len([d for d in spec.devices.split(",") if d.strip()])
        stage["devices"] = ",".join(str(i) for i in range(count))
    stage["async_chunk"] = streaming
    return {"async_chunk": streaming, "stages": [stage]}


def build_engine(model: str, spec: StageSpec) -> Any:
    """AsyncOmni for spec's stage alone. Blocking: it loads the model."""
    from vllm_omni.entrypoints.async_omni import AsyncOmni  # noqa: PLC0415

    fd, path = tempfile.mkstemp(prefix=f"omnipd-stage{spec.stage_id}-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(one_stage_config(spec), f, indent=1)
        return AsyncOmni(model=model, deploy_config=path)
    finally:
        os.unlink(path)


@dataclass
class ModelFacts:
    """What the worker needs to know about the loaded Thinker model."""

    max_model_len: int
    vocab_size: int
    accept_hidden_layer: int | None
    num_layers: int | None
    tts_token_ids: tuple[int, int, int] | None  # pad, bos, eos


def model_facts(engine: Any) -> ModelFacts:
    """Reads the model config the engine loaded (vLLM's EngineClient
    ``model_config``): the context length, the Thinker's vocabulary, the
    Talker's accept_hidden_layer (the Thinker captures layers 0 and that one,
    qwen3_omni.py ``capture_layer_indices``) and the TTS token ids
    (``Qwen3OmniMoeConfig.tts_pad_token_id`` and the others)."""
    mc = getattr(engine, "model_config", None)
    hf = getattr(mc, "hf_config", None)
    thinker = getattr(hf, "thinker_config", None)
    text = getattr(thinker, "text_config", None) or getattr(hf, "text_config", None) or hf
    talker = getattr(hf, "talker_config", None)
    layer = getattr(talker, "accept_hidden_layer", None)
    tts = tuple(getattr(hf, k, None) for k in ("tts_pad_token_id", "tts_bos_token_id", "tts_eos_token_id"))
    return ModelFacts(
        max_model_len=int(getattr(mc, "max_model_len", 0) or 0),
        vocab_size=int(getattr(text, "vocab_size", 0) or 0),
        accept_hidden_layer=int(layer) if layer is not None else None,
        num_layers=int(getattr(text, "num_hidden_layers", 0) or 0) or None,
        tts_token_ids=tts if all(isinstance(t, int) for t in tts) else None,  # type: ignore[arg-type]
    )
