"""Stand-in for vllm/exceptions.py (vLLM 0.29 and later: client errors are
``VLLMClientError``, no longer ``ValueError``; a ``VLLMValidationError`` is
vLLM's 400 naming ``parameter``, a ``VLLMUnprocessableEntityError`` its
422)."""

from __future__ import annotations

from typing import Any


class VLLMClientError(Exception):
    """A request vLLM refuses (4xx)."""


class VLLMValidationError(VLLMClientError):
    """A request field vLLM refuses: its 400, naming the parameter."""

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter, self.value = parameter, value


class VLLMUnprocessableEntityError(VLLMClientError):
    """Content vLLM cannot process, such as media a URL does not give: its
    422."""

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter, self.value = parameter, value
