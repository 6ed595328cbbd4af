"""Reading a request body safely: size limit, UTF-8, JSON, then a pydantic model.

Every failure becomes a GatewayError the route renders in its own protocol's error shape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from producers.gateway.errors import GatewayError, bad_request

ModelT = TypeVar("ModelT", bound=BaseModel)


async def read_limited(request: Request, max_bytes: int) -> bytes:
    """The raw body, refusing anything over ``max_bytes`` (declared or actually streamed)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(int(declared), max_bytes)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(size, max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_asgi_limited(receive: Callable[[], Awaitable[dict[str, Any]]], declared: str | None,
                            max_bytes: int) -> bytes:
    """The same limit for an ASGI middleware (the process router reads bodies before any route does):
    a declared length over ``max_bytes`` is refused before one byte is read, a streamed one as soon as it
    passes, so a hostile body costs at most ``max_bytes`` of memory however large it says or is."""
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(int(declared), max_bytes)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(size, max_bytes)
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def _too_large(size: int, max_bytes: int) -> GatewayError:
    return GatewayError(413, f"request body of {size} bytes exceeds the limit of {max_bytes} bytes",
                        "too_large", code="request_too_large")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Decode UTF-8 JSON and insist on an object at the top level."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"request body is not valid UTF-8 (byte {exc.start})",
                          code="invalid_encoding") from None
    if not raw.strip():
        raise bad_request("request body is empty; expected a JSON object", code="invalid_json")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request(f"request body must be a JSON object, got {type(data).__name__}",
                          code="invalid_json")
    return data


def validate(model: type[ModelT], data: dict[str, Any]) -> ModelT:
    """Validate with pydantic and name the first offending field the way the protocols do."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        raise bad_request(f"{where}: {first['msg']}{more}", param=where or None) from None
