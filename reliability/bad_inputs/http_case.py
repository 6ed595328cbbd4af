"""A request to the gateway and the answer it must get in the caller's protocol (OpenAI, Anthropic, env API)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Shape = Literal["openai", "anthropic", "env"]


@dataclass(frozen=True)
class HttpExpect:
    status: int
    shape: Shape
    code: str | None = None  # OpenAI / env error.code
    param: str | None = None  # OpenAI error.param
    error_type: str | None = None  # OpenAI error.type / Anthropic error.type / env error.type
    contains: str | None = None  # substring of the message


@dataclass(frozen=True)
class HttpCase:
    id: str
    area: Literal["openai", "anthropic", "env"]
    klass: str
    what: str
    path: str
    expect: HttpExpect
    body: Any = None  # sent as JSON unless ``raw`` is given
    raw: bytes | None = None
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)
    gap: str | None = None  # the gateway's current behaviour when it differs from ``expect``


def openai_error(status: int, code: str | None = None, param: str | None = None, contains: str | None = None,
        error_type: str | None = None) -> HttpExpect:
    return HttpExpect(status, "openai", code, param, error_type, contains)


def anthropic_error(status: int, error_type: str = "invalid_request_error", contains: str | None = None) -> HttpExpect:
    return HttpExpect(status, "anthropic", error_type=error_type, contains=contains)


def env_error(status: int, code: str | None = None, error_type: str | None = None,
         contains: str | None = None) -> HttpExpect:
    return HttpExpect(status, "env", code, None, error_type, contains)
