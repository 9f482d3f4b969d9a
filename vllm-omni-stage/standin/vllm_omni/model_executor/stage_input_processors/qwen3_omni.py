"""Stand-in for vllm_omni/model_executor/stage_input_processors/qwen3_omni.py
(vllm-omni main, 2026: ``thinker2talker(source_outputs, prompt=None,
requires_multimodal_data=False, streaming_context=None)``).

The same steps as upstream's, on lists instead of torch tensors: for each
Thinker output take ``outputs[0].cumulative_token_ids`` and the prompt ids,
the last ``len(prompt + output) - 1`` rows of layers 0 and
accept_hidden_layer from ``multimodal_output["hidden_states"]["layers"]``,
the TTS embeddings from ``multimodal_output["embed"]``, and build the
Talker's ``OmniTokensPrompt``: ``[0] * prompt_len`` tokens (Σ user turn
lengths + 9, system turns skipped: ``_compute_talker_prompt_ids_length``)
with the payload under ``additional_information`` as
``{"embed": {"prefill", "tts_bos", "tts_eos", "tts_pad"}, "hidden_states":
{"output"}, "ids": {"all", "prompt"}}``. The chat marker ids are the toy
vocabulary's (upstream: <|im_start|> 151644, system 8948, user 872,
assistant 77091).
"""

from __future__ import annotations

from typing import Any

from vllm_omni import _toy
from vllm_omni.inputs.data import OmniTokensPrompt

_EMBED_LAYER_KEY = "0"
_HIDDEN_LAYER_KEY = str(_toy.ACCEPT_HIDDEN_LAYER)


def _layer(layers: Any, key: str) -> Any:
    if not isinstance(layers, dict):
        return None
    v = layers.get(int(key))
    return v if v is not None else layers.get(key)


def _compute_talker_prompt_ids_length(info: dict[str, Any]) -> int:
    ids = info.get("ids", {})
    seq_len = len(ids["all"])
    prompt = list(ids["prompt"])
    starts = [i for i, t in enumerate(prompt) if t == _toy.IM_START] + [seq_len]
    total = 0
    for i in range(len(starts) - 1):
        s, e = starts[i], starts[i + 1]
        role = prompt[s + 1] if s + 1 < len(prompt) else None
        if role == _toy.SYSTEM:
            continue
        if role == _toy.USER:
            total += e - s
        elif role == _toy.ASSISTANT and i == len(starts) - 2:
            total += 9  # 3 + 4 + 1 + 1
    return total


def thinker2talker(
    source_outputs: list[Any],
    prompt: Any = None,
    requires_multimodal_data: bool = False,
    streaming_context: Any | None = None,
) -> list[OmniTokensPrompt]:
    talker_inputs: list[OmniTokensPrompt] = []
    for thinker_output in source_outputs:
        output = thinker_output.outputs[0]
        prompt_token_ids = list(thinker_output.prompt_token_ids)
        output_ids = list(output.cumulative_token_ids)
        new_seq_length = len(prompt_token_ids + output_ids) - 1
        mm = getattr(output, "multimodal_output", None)
        if not isinstance(mm, dict):
            continue
        layers = (mm.get("hidden_states") or {}).get("layers", {})
        emb, hid = _layer(layers, _EMBED_LAYER_KEY), _layer(layers, _HIDDEN_LAYER_KEY)
        if emb is None or hid is None:
            continue
        emb_rows = _toy.as_lists(emb)[-new_seq_length:] if new_seq_length > 0 else []
        hid_rows = _toy.as_lists(hid)[-new_seq_length:] if new_seq_length > 0 else []
        embed = mm.get("embed", {})
        info = {
            "embed": {"prefill": emb_rows, "tts_bos": embed.get("tts_bos"), "tts_eos": embed.get("tts_eos"),
                      "tts_pad": embed.get("tts_pad")},
            "hidden_states": {"output": hid_rows},
            "ids": {"all": prompt_token_ids + output_ids, "prompt": prompt_token_ids},
        }
        talker_inputs.append(OmniTokensPrompt(prompt_token_ids=[0] * _compute_talker_prompt_ids_length(info),
                                              additional_information=info, multi_modal_data=None,
                                              mm_processor_kwargs=None))
    return talker_inputs


_toy.drop_interfaces(globals(), __name__)
