"""Stand-in for vllm/entrypoints/chat_utils.py
(@001eadcf295d90aa0664963cd6a9d93f38a2f3da): ``parse_chat_messages_async``,
which turns OpenAI chat messages into the conversation a chat template
renders and the multimodal data the engine's processor takes.

As upstream: a string content is one text part; a part's type is read, or
inferred from its keys; an ``input_audio`` becomes the data URL
``data:audio/<format>;base64,<data>``; each media item is loaded by the
media connector (vllm/multimodal/media/connector.py
@02ba96d7874fea5610b3e2ccf22a95e27fc31aba): ``data:`` URLs decoded,
``file:`` URLs only under ``--allowed-local-media-path``, ``http(s)`` URLs
only from ``--allowed-media-domains`` when it is set — with upstream's
words for each refusal. In the ``"openai"`` content format a turn's content
is its parts, media as ``{"type": modality}``; in ``"string"`` its text with
one placeholder per item in front.

Unlike upstream the stand-in fetches no http(s) URL (tests need no
network) and decodes no video; an image is a PNG (its header), an audio
clip a WAV (the standard library's wave).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote, urlparse

from vllm.exceptions import VLLMValidationError
from vllm_omni import _toy

_TEXT_TYPES = ("text", "input_text", "output_text", "refusal", "thinking")
_MEDIA_TYPES = ("image_url", "input_image", "audio_url", "input_audio", "video_url")
_SUPPORTED = sorted(set(_TEXT_TYPES) | set(_MEDIA_TYPES) | {"image_embeds", "audio_embeds", "prompt_embeds",
                                                             "image_pil", "tool_reference"})


def _part_type(part: dict[str, Any]) -> str:
    kind = part.get("type")
    if isinstance(kind, str):
        return kind
    if kind is not None:
        raise ValueError("Invalid 'type' field in multimodal part.")
    for key in ("image_url", "audio_url", "video_url"):
        if key in part:
            return key
    if part.get("input_audio") is not None:
        return "input_audio"
    raise ValueError("Missing 'type' field in multimodal part.")


def _url(part: dict[str, Any], key: str) -> str | None:
    v = part.get(key)
    if isinstance(v, dict):
        v = v.get("url")
    return v if isinstance(v, str) else None


class _Connector:
    """The media connector's URL rules over the toy's decoders."""

    def __init__(self, model_config: Any) -> None:
        allowed = getattr(model_config, "allowed_local_media_path", "") or ""
        self.local = os.path.realpath(allowed) if allowed else None
        domains = getattr(model_config, "allowed_media_domains", None) or []
        self.domains = [domains] if isinstance(domains, str) else list(domains)

    def load(self, url: str) -> bytes:
        if url[:5].lower() == "data:":
            spec, sep, data = url[5:].partition(",")
            if not sep:
                raise ValueError(f"Invalid data URL {url[:32]!r}: missing ',' separator.")
            _, sep, encoding = spec.rpartition(";")
            if not sep or encoding != "base64":
                raise NotImplementedError("Only base64 data URLs are supported for now.")
            return base64.b64decode(data)
        u = urlparse(url)
        if u.scheme.startswith("http"):
            if self.domains and u.hostname not in self.domains:
                raise ValueError(f"The URL must be from one of the allowed domains: {self.domains}. "
                                 f"Input URL domain: {u.hostname}")
            raise ValueError("the stand-in engine fetches no http(s) media (vLLM's media connector does); "
                             "send a data: URL")
        if u.scheme == "file":
            if self.local is None:
                raise RuntimeError("Cannot load local files without `--allowed-local-media-path`.")
            path = unquote(u.netloc + u.path)
            if os.path.commonpath([self.local, os.path.realpath(path)]) != self.local:
                raise ValueError(f"The file path {path} must be a subpath of `--allowed-local-media-path "
                                 f"{self.local}`.")
            with open(path, "rb") as f:
                return f.read()
        raise ValueError("The URL must be either a HTTP, data or file URL.")


async def parse_chat_messages_async(
    messages: Iterable[Any],
    model_config: Any,
    content_format: str,
    media_io_kwargs: dict[str, dict[str, Any]] | None = None,
    mm_processor_kwargs: dict[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, list[Any]] | None, dict[str, list[Any]] | None]:
    """(conversation, multi_modal_data, multi_modal_uuids), as upstream."""
    connector = _Connector(model_config)
    conversation: list[dict[str, Any]] = []
    items: dict[str, list[Any]] = {}
    uuids: dict[str, list[Any]] = {}
    for msg in messages:
        content = msg.get("content")
        if content is None:
            content = []
        elif isinstance(content, str):
            content = [{"type": "text", "text": content}]
        parts: list[dict[str, Any]] = []
        placeholders: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append({"type": "text", "text": part})
                continue
            kind = _part_type(part)
            if kind in _TEXT_TYPES:
                text = part.get("thinking" if kind == "thinking" else ("refusal" if kind == "refusal" else "text"))
                if text is not None:
                    parts.append({"type": "text", "text": text})
                continue
            if kind not in _MEDIA_TYPES:
                raise VLLMValidationError(f"Unsupported chat content part type: {kind!r}. "
                                          f"Supported types: {', '.join(_SUPPORTED)}.", parameter="type", value=kind)
            if kind == "video_url":
                raise ValueError("the stand-in engine decodes no video (vLLM's video loader does)")
            if kind == "input_audio":
                ia = part.get("input_audio") or {}
                url = f"data:audio/{ia.get('format', '')};base64,{ia.get('data', '')}"
            elif kind == "input_image":
                url = part.get("image_url")
            else:
                url = _url(part, kind)
            modality = "image" if kind in ("image_url", "input_image") else "audio"
            if not isinstance(url, str):
                raise ValueError(f"the {kind} part has no URL")
            data = connector.load(url)
            item = _toy.decode_image(data) if modality == "image" else _toy.decode_audio(data)
            items.setdefault(modality, []).append(item)
            uuids.setdefault(modality, []).append(part.get("uuid"))
            parts.append({"type": modality})
            placeholders.append(_toy.PLACEHOLDERS[modality])
        if content_format == "openai":
            turn: dict[str, Any] = {"role": msg["role"], "content": parts}
        else:
            text = "\n".join(p["text"] for p in parts if p["type"] == "text")
            turn = {"role": msg["role"], "content": "\n".join([*placeholders, text] if text else placeholders)}
        if isinstance(msg.get("name"), str):
            turn["name"] = msg["name"]
        conversation.append(turn)
    return conversation, (items or None), (uuids or None)


_toy.drop_interfaces(globals(), __name__)
