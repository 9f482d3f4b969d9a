"""Every vllm-omni and vLLM interface the worker calls, checked at start-up.

The list lives here and nowhere else: each entry names the module, the
attribute (``Class.method`` for a method) and the keyword parameters the
worker passes, with the upstream file it was read from. ``check`` imports
each module and inspects each signature before anything is loaded, so that
an install of another vllm-omni release fails at once with one line naming
what is missing, instead of a TypeError in the middle of a request.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any

WRITTEN_AGAINST = "0.32.0"


ALL = ("thinker", "talker", "code2wav")


@dataclass(frozen=True)
class Interface:
    module: str
    attr: str
    params: tuple[str, ...] = ()
    source: str = ""
    stages: tuple[str, ...] = ALL  # the stages that call it

    @property
    def name(self) -> str:
        return f"{self.module}.{self.attr}"


INTERFACES: tuple[Interface, ...] = (
    # vLLM's first: vllm-omni's modules import them.
    Interface("vllm.sampling_params", "SamplingParams",
              ("n", "temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "min_tokens", "stop",
               "stop_token_ids", "ignore_eos", "repetition_penalty", "presence_penalty", "frequency_penalty",
               "skip_special_tokens", "detokenize", "output_kind", "extra_args"),
              "vllm/sampling_params.py"),
    Interface("vllm.sampling_params", "RequestOutputKind", (), "vllm/sampling_params.py"),
    # A chat with media: vLLM's parsing fetches and decodes the parts into
    # the conversation and the multimodal data (omnipd_stage/media.py).
    Interface("vllm.entrypoints.chat_utils", "parse_chat_messages_async",
              ("messages", "model_config", "content_format", "media_io_kwargs", "mm_processor_kwargs"),
              "vllm/entrypoints/chat_utils.py@001eadcf295d90aa0664963cd6a9d93f38a2f3da", ("thinker",)),
    Interface("vllm_omni.config.resolver", "resolve_omni_config",
              ("trust_remote_code", "deploy_config_path", "cli_overrides", "stage_overrides", "strategy_config_path"),
              "vllm_omni/config/resolver.py"),
    Interface("vllm_omni.entrypoints.async_omni", "AsyncOmni", (), "vllm_omni/entrypoints/async_omni.py"),
    Interface("vllm_omni.entrypoints.async_omni", "AsyncOmni.generate",
              ("prompt", "sampling_params", "request_id", "sampling_params_list"),
              "vllm_omni/entrypoints/async_omni.py"),
    Interface("vllm_omni.entrypoints.async_omni", "AsyncOmni.abort", ("request_id",),
              "vllm_omni/entrypoints/async_omni.py"),
    Interface("vllm_omni.entrypoints.async_omni", "AsyncOmni.get_tokenizer", (),
              "vllm/engine/protocol.py (EngineClient)", ("thinker",)),
    Interface("vllm_omni.inputs.data", "OmniTokensPrompt", (), "vllm_omni/inputs/data.py", ("talker", "code2wav")),
    Interface("vllm_omni.model_executor.stage_input_processors.qwen3_omni", "thinker2talker",
              ("source_outputs", "prompt", "requires_multimodal_data", "streaming_context"),
              "vllm_omni/model_executor/stage_input_processors/qwen3_omni.py", ("talker",)),
    # A Talker fed while it runs (talker_feed.py): the worker writes the
    # chunks its engine's chunk transfer adapter polls.
    Interface("vllm_omni.distributed.omni_connectors", "OmniConnectorFactory.create_connector", ("spec",),
              "vllm_omni/distributed/omni_connectors/factory.py@0342827dd787296b8a6b1e9f523ebaa24d13c714",
              ("talker",)),
    Interface("vllm_omni.distributed.omni_connectors", "ConnectorSpec", ("name", "extra"),
              "vllm_omni/distributed/omni_connectors/utils/config.py@0342827dd787296b8a6b1e9f523ebaa24d13c714",
              ("talker",)),
    Interface("vllm_omni.distributed.omni_connectors.adapter", "compute_talker_prompt_ids_length", ("prompt_ids",),
              "vllm_omni/distributed/omni_connectors/adapter.py@0342827dd787296b8a6b1e9f523ebaa24d13c714",
              ("talker",)),
)


def _param_names(obj: Any) -> set[str] | None:
    """The keyword parameters obj takes; None when any keyword is taken
    (``**kwargs``) or the signature cannot be read."""
    fields = getattr(obj, "__struct_fields__", None)  # msgspec.Struct (vLLM's SamplingParams)
    if fields is not None:
        return set(fields)
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return set(sig.parameters)


def missing(stage: str | None = None, interfaces: tuple[Interface, ...] = INTERFACES) -> str | None:
    """The first interface absent from the installed packages, written as
    ``module.attr`` or ``module.attr(param=)``; None when all are there.
    With a stage, the interfaces that stage calls; without, those every
    stage calls (checked before the deploy config is read)."""
    for itf in interfaces:
        if (stage is None and itf.stages != ALL) or (stage is not None and stage not in itf.stages):
            continue
        try:
            obj: Any = importlib.import_module(itf.module)
        except ImportError:
            return itf.name
        for part in itf.attr.split("."):
            if not hasattr(obj, part):
                return itf.name
            obj = getattr(obj, part)
        names = _param_names(obj) if itf.params else None
        if names is not None:
            for p in itf.params:
                if p not in names:
                    return f"{itf.name}({p}=)"
    return None


def installed_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415
        try:
            return version("vllm-omni")
        except PackageNotFoundError:
            pass
    except ImportError:
        pass
    try:
        mod = importlib.import_module("vllm_omni")
    except ImportError:
        return "(not installed)"
    return str(getattr(mod, "__version__", "(unknown version)"))


def check_message(stage: str | None = None) -> str | None:
    """The start-up refusal line, or None when every interface is there."""
    gone = missing(stage)
    if gone is None:
        return None
    return (f"omnipd_stage: vllm-omni {installed_version()} lacks {gone} (written against vllm-omni "
            f"v{WRITTEN_AGAINST}); install v{WRITTEN_AGAINST} or newer")
