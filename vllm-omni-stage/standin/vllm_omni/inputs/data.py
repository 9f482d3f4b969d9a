"""Stand-in for vllm_omni/inputs/data.py (vllm-omni v0.32.0):
``OmniTokensPrompt``, vLLM's ``TokensPrompt`` (a TypedDict) with
``additional_information`` for the stage's side inputs."""

from __future__ import annotations

from typing import Any, TypedDict


class OmniTokensPrompt(TypedDict, total=False):
    prompt_token_ids: list[int]
    additional_information: Any
    multi_modal_data: Any
    mm_processor_kwargs: Any


def _drop() -> None:
    from vllm_omni import _toy  # noqa: PLC0415

    _toy.drop_interfaces(globals(), __name__)


_drop()
