"""Errors raised anywhere in the gateway, rendered in the caller's protocol.

One exception type carries status, message and a protocol-neutral kind; each protocol renders it in
its own JSON shape (OpenAI ``{"error": {...}}``, Anthropic ``{"type": "error", "error": {...}}``).
"""

from __future__ import annotations

import logging
import secrets
from typing import Any, Literal

Protocol = Literal["openai", "anthropic", "env"]

# Protocol-neutral kind -> (OpenAI error type, Anthropic error type).
_KINDS: dict[str, tuple[str, str]] = {
    "invalid_request": ("invalid_request_error", "invalid_request_error"),
    "authentication": ("authentication_error", "authentication_error"),
    "permission": ("permission_error", "permission_error"),
    "not_found": ("invalid_request_error", "not_found_error"),
    "conflict": ("invalid_request_error", "invalid_request_error"),
    "too_large": ("invalid_request_error", "request_too_large"),
    "rate_limit": ("rate_limit_error", "rate_limit_error"),
    "upstream": ("server_error", "api_error"),
    "overloaded": ("server_error", "overloaded_error"),
    "internal": ("server_error", "api_error"),
    "unavailable": ("server_error", "api_error"),
}


class GatewayError(Exception):
    """A request the gateway refuses or cannot serve; ``kind`` is one of the keys of ``_KINDS``."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request", *,
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        if kind not in _KINDS:
            raise ValueError(f"unknown error kind {kind!r}")
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code

    def openai_body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": _KINDS[self.kind][0], "param": self.param,
                          "code": self.code}}

    def anthropic_body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": _KINDS[self.kind][1], "message": self.message}}

    def body(self, protocol: Protocol) -> dict[str, Any]:
        if protocol == "anthropic":
            return self.anthropic_body()
        if protocol == "openai":
            return self.openai_body()
        # Environment API: OpenAI-like shape with the neutral kind, so scripts can switch on it.
        return {"error": {"type": self.kind, "message": self.message, "code": self.code}}


def internal_error(what: str, log: logging.Logger, exc: BaseException) -> GatewayError:
    """A 500 that says nothing of the exception (its text may hold paths, addresses, a request's content or a
    secret): the log has it, with the traceback, under the reference the caller is given."""
    reference = secrets.token_hex(6)
    log.error("internal error %s (reference %s)", what, reference, exc_info=exc)
    return GatewayError(500, f"internal error {what}; the gateway's log has the details under reference "
                             f"{reference}", "internal", code="internal_error")


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, "invalid_request", param=param, code=code)


def not_found(message: str, *, code: str | None = None) -> GatewayError:
    return GatewayError(404, message, "not_found", code=code)


def conflict(message: str, *, code: str | None = None) -> GatewayError:
    return GatewayError(409, message, "conflict", code=code)
