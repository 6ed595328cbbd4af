"""``POST /v1/responses``: the OpenAI Responses route, on the gateway's shared call path.

Kept out of app.py (one route line there); it uses the same steps as the chat route: identify the
attempt, read and convert the request, prepare (render + index), then the gateway's unary or SSE path.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from producers.gateway import records, responses_adapter
from producers.gateway.body import read_model
from producers.gateway.chat import CallOutcome
from producers.gateway.errors import GatewayError
from producers.gateway.models_responses import ResponsesRequest

if TYPE_CHECKING:
    from producers.gateway.app import Gateway


class ResponsesRoute:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def create(self, request: Request) -> Response:
        gw = self.gateway
        started, received = time.perf_counter(), records.now_us()
        try:
            identity = gw._identity(request)
            req, raw = await read_model(request, ResponsesRequest, gw.options.max_body_bytes)
            gw.service.check_model(req.model)
            call = responses_adapter.to_internal(req, gw.options.max_tokens_limit)
            prep = gw._prepare(request, identity, call, raw, received, started,
                               responses_adapter.ADAPTER_VERSION, responses_adapter.TOOL_CALL_PREFIX)
        except GatewayError as exc:
            return gw._refuse(exc, "openai", responses_adapter.PROTOCOL)

        def respond(outcome: CallOutcome) -> dict[str, Any]:
            return responses_adapter.response_body(outcome, req)

        if req.stream:
            fmt = responses_adapter.ResponseStream(req, prep.call_id, received // 1_000_000)
            return gw._stream(prep, fmt, respond, GatewayError.openai_body, ping=None)
        return await gw._unary(prep, respond, GatewayError.openai_body)
