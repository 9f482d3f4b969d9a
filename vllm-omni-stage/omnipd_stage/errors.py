"""OpenAI's error body and the exceptions that carry it.

Every handler raises :class:`APIError` for an answer the client should read;
one place (``httpserver``) writes it as ``{"error": {"message", "type",
"param", "code"}}`` with its status, as OpenAI and vLLM's OpenAI server do.
"""

from __future__ import annotations

import json
from typing import Any

INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
SERVER = "server_error"
UPSTREAM = "upstream_error"


class APIError(Exception):
    """An error the client reads: status, message, OpenAI type, param, code."""

    def __init__(self, status: int, message: str, *, type_: str = INVALID_REQUEST,
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(param: str | None, message: str, code: str | None = None) -> APIError:
    """A 400 naming the parameter at fault."""
    return APIError(400, message, param=param, code=code)


def not_found(message: str, code: str | None = None) -> APIError:
    return APIError(404, message, type_=NOT_FOUND, code=code)


def model_not_found(model: str) -> APIError:
    """vLLM's and OpenAI's 404 for a model this worker does not serve."""
    return APIError(404, f"The model {json.dumps(model)} does not exist.", param="model", code="model_not_found")


def unauthorized() -> APIError:
    return APIError(401, 'this stage worker requires the deployment secret as "Authorization: Bearer <secret>"',
                    code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def internal(message: str) -> APIError:
    return APIError(500, message, type_=SERVER)


def unavailable(message: str) -> APIError:
    return APIError(503, message, type_=SERVER, code="service_unavailable")
