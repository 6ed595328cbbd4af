"""Server-sent event framing for both protocols."""

from __future__ import annotations

from typing import Any

import orjson


def data_event(payload: dict[str, Any]) -> bytes:
    """OpenAI style: ``data: {...}`` frames, no event names."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def named_event(name: str, payload: dict[str, Any]) -> bytes:
    """Anthropic style: every frame names its event and repeats it as the payload's ``type``."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
