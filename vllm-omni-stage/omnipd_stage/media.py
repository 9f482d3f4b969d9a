"""A Thinker chat with media: the engine prompt vLLM's OpenAI server builds.

vLLM's chat parsing (``parse_chat_messages_async`` in
vllm/entrypoints/chat_utils.py @001eadcf295d90aa0664963cd6a9d93f38a2f3da)
fetches and decodes every media part with vLLM's media connector — under
the stage's ``allowed_local_media_path`` and ``allowed_media_domains``,
which it reads from the engine's ``model_config`` as ``vllm serve``'s flags
set them — and returns the conversation, each media part as
``{"type": "image"}`` / ``{"type": "audio"}`` in the ``"openai"`` content
format, with the multimodal data. The chat template renders each such part
as Qwen3-Omni's placeholder (``<|audio_start|><|audio_pad|><|audio_end|>``,
``<|vision_start|><|image_pad|><|vision_end|>``), the worker tokenizes it as
it tokenizes a text chat, and hands the engine
``{"prompt_token_ids", "multi_modal_data", "multi_modal_uuids"?,
"mm_processor_kwargs"?}`` (vLLM's ``TokensPrompt``): the Thinker's own
multimodal processor expands each pad into the item's placeholder count.
vllm-omni's chat serving passes ``mm_processor_kwargs`` the same way, on the
engine prompt (vllm_omni/entrypoints/openai/serving_chat.py
@00a3619b9b6647378a285e9d135475e2fa085744, ``_preprocess_chat``).

Under PD both legs get the same request and both build the same prompt;
only the prefill's engine needs the encoder outputs, the decode's
processor rebuilds the placeholders.

Errors are vLLM's: its parsing and media connector raise ``ValueError``,
``TypeError`` or ``RuntimeError`` for media they cannot take (vLLM's chat
server answers those 400) and, since vLLM 0.29, ``VLLMValidationError``
(400) and ``VLLMUnprocessableEntityError`` (422, a URL that does not give
the media). vLLM does not say which part failed; the worker parses each
media part on its own, on the error path only, to name it
(``messages[1].content[2]``).
"""

from __future__ import annotations

import re
from typing import Any

from .errors import APIError, invalid
from .params import Generation

# The content format in which vLLM hands a chat template the parts of a
# turn; vLLM detects it from the template (vllm/renderers/hf.py
# @02e64f581de43218449b3c3450896c43a89f40e0, _detect_content_format: a
# template that loops over a message's content is "openai"), as Qwen3-Omni's
# does.
CONTENT_FORMAT = "openai"

_PART = re.compile(r"messages\[(\d+)\]\.content\[(\d+)\]")


def client_status(e: BaseException) -> int | None:
    """The status vLLM's OpenAI server answers an exception of request
    processing with: 422 for VLLMUnprocessableEntityError, 404 for
    VLLMNotFoundError, 400 for its other client errors and for ValueError,
    TypeError and RuntimeError (serving_chat's preprocessing handler); a
    local file that cannot be read is the client's too. None: the server's
    own failure."""
    names = {c.__name__ for c in type(e).__mro__}
    if "VLLMUnprocessableEntityError" in names:
        return 422
    if "VLLMNotFoundError" in names:
        return 404
    if "VLLMClientError" in names or isinstance(e, (ValueError, TypeError, RuntimeError)):
        return 400
    if isinstance(e, (FileNotFoundError, IsADirectoryError, PermissionError)):
        return 400
    return None


def _refusal(param: str, e: BaseException, status: int) -> APIError:
    message = str(e) or type(e).__name__
    if getattr(e, "parameter", None) == "type":
        param += ".type"
    return APIError(status, f"{param}: {message}", param=param)


async def _parse(messages: list[dict[str, Any]], model_config: Any, g: Generation) -> tuple[Any, Any, Any]:
    from vllm.entrypoints.chat_utils import parse_chat_messages_async  # noqa: PLC0415

    return await parse_chat_messages_async(messages, model_config, CONTENT_FORMAT,
                                           media_io_kwargs=g.media_io_kwargs,
                                           mm_processor_kwargs=g.mm_processor_kwargs)


async def engine_prompt(engine: Any, tokenizer: Any, g: Generation) -> tuple[list[int], dict[str, Any]]:
    """The unexpanded prompt ids (one pad per item) and the engine prompt
    of a chat with media; a 4xx naming the part for media vLLM refuses."""
    messages = g.raw_messages or []
    model_config = engine.model_config
    try:
        conversation, mm_data, mm_uuids = await _parse(messages, model_config, g)
    except Exception as e:
        status = client_status(e)
        if status is None:
            raise
        raise await _locate(messages, model_config, g, e, status) from None
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False,
                                             add_generation_prompt=g.add_generation_prompt,
                                             **g.chat_template_kwargs)
    except Exception as e:  # vLLM's safe_apply_chat_template: the template's error is a ValueError
        raise invalid("messages", f"the chat template cannot render these messages: {e}") from None
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    prompt: dict[str, Any] = {"prompt_token_ids": ids, "multi_modal_data": mm_data or {}}
    if mm_uuids and any(u is not None for us in mm_uuids.values() for u in (us or [])):
        prompt["multi_modal_uuids"] = mm_uuids
    if g.mm_processor_kwargs:
        prompt["mm_processor_kwargs"] = g.mm_processor_kwargs
    return ids, prompt


async def _locate(messages: list[dict[str, Any]], model_config: Any, g: Generation, e: BaseException,
                  status: int) -> APIError:
    """The refusal of the first media part that fails on its own, or of the
    messages when none does (a limit on the items of a prompt)."""
    for path in g.media_parts:
        m = _PART.fullmatch(path)
        if m is None:
            continue
        i, j = int(m.group(1)), int(m.group(2))
        one = [{"role": messages[i]["role"], "content": [messages[i]["content"][j]]}]
        try:
            await _parse(one, model_config, g)
        except Exception as part_error:
            part_status = client_status(part_error)
            if part_status is not None:
                return _refusal(path, part_error, part_status)
    return _refusal("messages", e, status)
