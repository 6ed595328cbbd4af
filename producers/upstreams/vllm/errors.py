"""vLLM's error answers as the caller's errors: an error body mapped to an ``UpstreamError`` with vLLM's own
``type`` and ``param`` kept, and the error for a server lost before its answer was complete."""

from __future__ import annotations

import orjson

from producers.upstreams.base import UpstreamError


class VLLMError(UpstreamError):
    """An error answer of a vLLM server, with vLLM's own error ``type`` and ``param`` kept."""

    def __init__(
        self,
        message: str,
        status_code: int,
        error_type: str,
        *,
        vllm_type: str = "",
        param: str | None = None,
        server: str = "",
    ) -> None:
        super().__init__(message, status_code, error_type)
        self.vllm_type = vllm_type
        self.param = param
        self.server = server


class ServerLost(UpstreamError):
    """The connection to ``server`` broke before its answer was complete (the server was killed or went
    away); a 502 ``upstream_unavailable`` to the caller when no other server can take the request."""

    def __init__(self, message: str, server: str) -> None:
        super().__init__(message, 502, "upstream_unavailable")
        self.server = server


def _openai_error_type(status: int) -> str:
    if status == 400 or status == 422:
        return "invalid_request_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    return "upstream_error"


def error_from_response(status: int, body: bytes, server: str) -> VLLMError:
    """Map a vLLM error body ``{"error": {"message", "type", "param", "code"}}`` to an UpstreamError."""
    message, vllm_type, param = body.decode(errors="replace")[:2000] or f"HTTP {status}", "", None
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        error = parsed.get("error", parsed)
        if isinstance(error, dict):
            message = str(error.get("message") or error.get("detail") or message)
            vllm_type = str(error.get("type") or "")
            param = error.get("param")
        elif isinstance(error, str):
            message = error
    # Client errors pass through with their status; a failing server is a bad gateway to the caller.
    mapped = status if 400 <= status < 500 else 502
    return VLLMError(
        f"vLLM ({server}): {message}", mapped, _openai_error_type(status), vllm_type=vllm_type,
        param=param, server=server,
    )


def bad_answer(server: str, what: str) -> UpstreamError:
    """A 502 for an answer that breaks the protocol the call record relies on (missing ids, wrong counts)."""
    return UpstreamError(f"vLLM ({server}) {what}", 502, "upstream_error")
