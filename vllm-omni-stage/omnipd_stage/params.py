"""Reading an OpenAI request body into what the engine takes.

The subset of vLLM's CompletionRequest / ChatCompletionRequest that omnipd
sends a Thinker leg (and that users of vllm serve send most): sampling
parameters, streaming, ``kv_transfer_params``, ``return_token_ids``,
``add_generation_prompt``, chat media parts (their shape; vLLM's parsing
fetches and decodes them, omnipd_stage/media.py), ``mm_processor_kwargs``,
``media_io_kwargs`` and omnipd's ``omnipd_conditioning``. Each field
is checked for its type and range, and a wrong one is a 400 naming it.
Parameters the worker does not implement yet are refused with a 400 naming
them, never silently ignored; asking for nothing (null, false, an empty
list) is accepted, as vLLM accepts it.

The sampling parameters go to vLLM's ``SamplingParams`` with
``kv_transfer_params`` under ``extra_args``, as vLLM's OpenAI server puts
them (vllm/entrypoints/openai/completion/protocol.py and
chat_completion/protocol.py, ``to_sampling_params``, vLLM 0.32).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import invalid

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's and vLLM's default for /v1/completions

# Fields a request may carry only when they ask for nothing.
_UNSUPPORTED = (
    ("logprobs", "logprobs"), ("top_logprobs", "logprobs"), ("prompt_logprobs", "logprobs"),
    ("logit_bias", "logit biases"), ("echo", "echoing the prompt"), ("suffix", "a suffix"),
    ("use_beam_search", "beam search"), ("guided_json", "structured output"),
    ("guided_regex", "structured output"), ("guided_choice", "structured output"),
    ("guided_grammar", "structured output"), ("structured_outputs", "structured output"),
    ("bad_words", "banned words"), ("allowed_token_ids", "a token allow-list"),
    ("logits_processors", "logits processors"), ("prompt_embeds", "prompt embeddings"),
    ("continue_final_message", "continuing the final message"),
    ("include_stop_str_in_output", "stop strings kept in the output"),
)


def _empty(v: Any) -> bool:
    return v is None or v is False or v == 0 or v == "" or v == [] or v == {}


@dataclass
class Conditioning:
    key: str
    layer: int
    stream: bool


@dataclass
class Generation:
    """One request, read from either endpoint."""

    chat: bool
    model: str | None
    prompt_text: str | None = None
    prompt_ids: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False
    kv_transfer_params: dict[str, Any] | None = None
    conditioning: Conditioning | None = None
    # A chat with media parts: the messages as the client sent them (for
    # vLLM's chat parsing, which fetches and decodes the media), where each
    # media part is, and the processor's and media loaders' options.
    media_parts: list[str] = field(default_factory=list)
    raw_messages: list[dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, Any] | None = None


def _number(body: dict[str, Any], name: str, lo: float | None = None, hi: float | None = None,
            lo_open: bool = False) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise invalid(name, f"{name} must be a number")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise invalid(name, f"{name} must be {'>' if lo_open else '>='} {lo}, got {v}")
    if hi is not None and v > hi:
        raise invalid(name, f"{name} must be <= {hi}, got {v}")
    return float(v)


def _integer(body: dict[str, Any], name: str, lo: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        else:
            raise invalid(name, f"{name} must be an integer")
    if lo is not None and v < lo:
        raise invalid(name, f"{name} must be at least {lo}, got {v}")
    return v


def _boolean(body: dict[str, Any], name: str) -> bool | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, bool):
        raise invalid(name, f"{name} must be true or false")
    return v


def _token_ids(v: Any, param: str) -> list[int]:
    if not isinstance(v, list):
        raise invalid(param, f"{param} must be a list of token ids")
    for i, t in enumerate(v):
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise invalid(f"{param}[{i}]", f"{param}[{i}] must be a non-negative integer token id")
    return v


def read_generation(body: dict[str, Any], chat: bool, default_layer: int | None) -> Generation:
    """The request in body, checked; raises a 400 naming the first bad field."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid("model", "model must be a string")
    g = Generation(chat=chat, model=model or None)
    for name, needs in _UNSUPPORTED:
        if name in body and not _empty(body[name]):
            raise invalid(name, f"{name} needs {needs}, which this worker does not support yet; omit it")
    best_of = body.get("best_of")
    if best_of not in (None, 1):
        raise invalid("best_of", "best_of > 1 is not supported by this worker yet")
    n = _integer(body, "n", 1)
    if n not in (None, 1):
        raise invalid("n", "n > 1 is not supported by this worker yet")
    if chat:
        read_messages(body, g)
    else:
        _read_prompt(body, g)

    mt = _integer(body, "max_tokens", 1)
    if chat:
        mct = _integer(body, "max_completion_tokens", 1)
        if mct is not None:
            mt = mct
    g.max_tokens = mt
    s = g.sampling
    for name, lo, hi, lo_open in (("temperature", 0, None, False), ("top_p", 0, 1, True), ("min_p", 0, 1, False),
                                  ("repetition_penalty", 0, None, True), ("presence_penalty", -2, 2, False),
                                  ("frequency_penalty", -2, 2, False)):
        v = _number(body, name, lo, hi, lo_open)
        if v is not None:
            s[name] = v
    top_k = _integer(body, "top_k")
    if top_k is not None:
        if top_k < -1:
            raise invalid("top_k", f"top_k must be -1 (disable), 0 (disable) or at least 1, got {top_k}")
        s["top_k"] = top_k
    seed = _integer(body, "seed")
    if seed is not None:
        s["seed"] = seed
    min_tokens = _integer(body, "min_tokens", 0)
    if min_tokens is not None:
        s["min_tokens"] = min_tokens
    for name in ("ignore_eos", "skip_special_tokens"):
        v = _boolean(body, name)
        if v is not None:
            s[name] = v
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(x, str) for x in stop):
            raise invalid("stop", "stop must be a string or a list of strings")
        if stop:
            s["stop"] = stop
    sti = body.get("stop_token_ids")
    if sti is not None:
        s["stop_token_ids"] = _token_ids(sti, "stop_token_ids")

    g.stream = bool(_boolean(body, "stream"))
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise invalid("stream_options", "stream_options must be an object")
        if not g.stream:
            raise invalid("stream_options", "stream_options can only be set when stream is true")
        inc = opts.get("include_usage")
        if inc is not None and not isinstance(inc, bool):
            raise invalid("stream_options.include_usage", "include_usage must be true or false")
        g.include_usage = bool(inc)
        if opts.get("continuous_usage_stats"):
            raise invalid("stream_options.continuous_usage_stats",
                          "continuous_usage_stats is not supported by this worker yet")
    g.return_token_ids = bool(_boolean(body, "return_token_ids"))
    kvp = body.get("kv_transfer_params")
    if kvp is not None and not isinstance(kvp, dict):
        raise invalid("kv_transfer_params", "kv_transfer_params must be an object")
    g.kv_transfer_params = kvp or None
    if "omnipd_conditioning" in body and body["omnipd_conditioning"] is not None:
        g.conditioning = _read_conditioning(body["omnipd_conditioning"], default_layer)
    return g


def _read_prompt(body: dict[str, Any], g: Generation) -> None:
    prompt = body.get("prompt")
    if prompt is None:
        raise invalid("prompt", "prompt is required")
    if isinstance(prompt, str):
        g.prompt_text = prompt
        return
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            g.prompt_ids = _token_ids(prompt, "prompt")
            return
        if len(prompt) == 1 and isinstance(prompt[0], str):
            g.prompt_text = prompt[0]
            return
        if len(prompt) == 1 and isinstance(prompt[0], list):
            g.prompt_ids = _token_ids(prompt[0], "prompt")
            return
        if len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
            raise invalid("prompt", "a batch of prompts is not supported by this worker; send one prompt per request")
    raise invalid("prompt", "prompt must be a string, a list of token ids, or a list holding one of them")


def read_messages(body: dict[str, Any], g: Generation) -> None:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise invalid("messages", "messages must be a non-empty list")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(msgs):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise invalid(p, f"{p} must be an object")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise invalid(f"{p}.role", f"{p}.role must be a non-empty string")
        content = m.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                pp = f"{p}.content[{j}]"
                if not isinstance(part, dict):
                    raise invalid(pp, f"{pp} must be an object")
                if _read_part(part, pp):
                    g.media_parts.append(pp)
                else:
                    parts.append(part["text"])
            text = "".join(parts)
        else:
            raise invalid(f"{p}.content", f"{p}.content must be a string or a list of parts")
        if m.get("tool_calls"):
            raise invalid(f"{p}.tool_calls", "tool calls are not supported by this worker yet")
        out.append({"role": role, "content": text})
    g.messages = out
    if g.media_parts:
        g.raw_messages = msgs
    for name in ("mm_processor_kwargs", "media_io_kwargs"):
        v = body.get(name)
        if v is not None and not isinstance(v, dict):
            raise invalid(name, f"{name} must be an object")
        setattr(g, name, v or None)
    uav = (g.mm_processor_kwargs or {}).get("use_audio_in_video")
    if uav is not None and not isinstance(uav, bool):
        raise invalid("mm_processor_kwargs.use_audio_in_video", "use_audio_in_video must be true or false")
    tools = body.get("tools")
    if tools:
        raise invalid("tools", "tools need a tool-call parser, which this worker does not have yet; omit tools")
    tc = body.get("tool_choice")
    if tc not in (None, "none", "auto") and not (tc == "required" and tools == []):
        raise invalid("tool_choice", "tool_choice needs tools, which this worker does not support yet")
    rf = body.get("response_format")
    if rf not in (None, {}) and not (isinstance(rf, dict) and rf.get("type") == "text"):
        raise invalid("response_format", "response_format needs structured output, which this worker does not "
                                         "support yet; omit it or use {\"type\": \"text\"}")
    agp = _boolean(body, "add_generation_prompt")
    g.add_generation_prompt = True if agp is None else agp
    ctk = body.get("chat_template_kwargs")
    if ctk is not None:
        if not isinstance(ctk, dict):
            raise invalid("chat_template_kwargs", "chat_template_kwargs must be an object")
        g.chat_template_kwargs = ctk


# Content parts, by type, as vLLM's chat parsing reads them (MM_PARSER_MAP
# in vllm/entrypoints/chat_utils.py @001eadcf295d90aa0664963cd6a9d93f38a2f3da).
_TEXT_PARTS = ("text", "input_text", "output_text")
_URL_PARTS = ("image_url", "audio_url", "video_url")
_MEDIA_PARTS = (*_URL_PARTS, "input_image", "input_audio")
_NOT_SERVED = {"image_embeds": "precomputed embeddings", "audio_embeds": "precomputed embeddings",
               "prompt_embeds": "precomputed embeddings", "image_pil": "in-process PIL images",
               "refusal": "refusal parts", "thinking": "thinking parts", "tool_reference": "tool references"}
_SUPPORTED_PARTS = ", ".join((*_TEXT_PARTS, *_MEDIA_PARTS))


def _read_part(part: dict[str, Any], pp: str) -> bool:
    """Checks one content part's shape; True for a media part. Fetching and
    decoding are left to vLLM's parsing, which names what it cannot take."""
    kind = part.get("type")
    if kind is None:
        # vLLM infers a part's type from its first media key.
        kind = next((k for k in ("image_url", "audio_url", "input_audio", "video_url") if part.get(k) is not None),
                    None)
        if kind is None:
            raise invalid(f"{pp}.type", "Missing 'type' field in multimodal part.")
    if not isinstance(kind, str):
        raise invalid(f"{pp}.type", "Invalid 'type' field in multimodal part.")
    if kind in _TEXT_PARTS:
        if not isinstance(part.get("text"), str):
            raise invalid(f"{pp}.text", f"{pp}.text must be a string")
        return False
    if kind in _NOT_SERVED:
        raise invalid(f"{pp}.type", f"{pp} is a {kind!r} part: {_NOT_SERVED[kind]} are not supported by this "
                                    f"worker; send one of {_SUPPORTED_PARTS}")
    if kind not in _MEDIA_PARTS:
        # vLLM's words (chat_utils.py, _parse_chat_message_content_part).
        raise invalid(f"{pp}.type", f"Unsupported chat content part type: {kind!r}. Supported types: "
                                    f"{_SUPPORTED_PARTS}.")
    v = part.get(kind)
    if kind in _URL_PARTS:
        url = v.get("url") if isinstance(v, dict) else (v if "type" not in part else None)
        if not isinstance(url, str) or not url:
            raise invalid(f"{pp}.{kind}", f'{pp}.{kind} must be {{"url": a data:, http(s) or file: URL}}')
    elif kind == "input_image":
        if not isinstance(part.get("image_url"), str) or not part["image_url"]:
            raise invalid(f"{pp}.image_url", f"{pp}.image_url must be a URL (a string)")
    elif not (isinstance(v, dict) and isinstance(v.get("data"), str) and v["data"]
              and isinstance(v.get("format"), str) and v["format"]):
        raise invalid(f"{pp}.input_audio", f'{pp}.input_audio must be {{"data": base64 audio, "format": '
                                           '"wav" or "mp3"}')
    return True


def _read_conditioning(v: Any, default_layer: int | None) -> Conditioning:
    want = 'want {"key": a string of 1..256 characters, "layer": the accept_hidden_layer, "stream": true or false}'
    if not isinstance(v, dict):
        raise invalid("omnipd_conditioning", want)
    key = v.get("key")
    if not isinstance(key, str) or not key or len(key) > 256:
        raise invalid("omnipd_conditioning", want)
    layer = v.get("layer", default_layer)
    if layer is None:
        layer = default_layer
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 1:
        raise invalid("omnipd_conditioning", want)
    stream = v.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid("omnipd_conditioning", want)
    return Conditioning(key=key, layer=layer, stream=stream)
