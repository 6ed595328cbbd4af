"""The gateway's Starlette app with a direct path for model calls (``GatewayApp``), and how a request's path
names a model call (``match_model_call``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

Endpoint = Callable[[Request], Awaitable[Response]]
ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]


class GatewayApp(Starlette):
    """The Starlette app, but a model call goes straight to its endpoint.

    Starlette's two exception middlewares, its router (a regular expression per route, tried in turn) and
    the per-request wrappers cost more CPU than what they do for these routes. A ``POST`` to a model-call
    path (``Gateway.model_calls``, under ``/v1`` or an attempt's prefix) is served here with the same
    request object, path parameters and exception handling: an ``HTTPException`` goes to the app's handler
    for it, any other exception to the 500 handler, whose response is sent before the exception is raised
    on (as Starlette's ``ServerErrorMiddleware`` does). Everything else, and any scope with a ``root_path``,
    takes Starlette's way."""

    def __init__(self, *, model_calls: dict[str, Endpoint], http_error: ErrorHandler, crash: ErrorHandler,
                 **kwargs: Any) -> None:
        super().__init__(exception_handlers={HTTPException: http_error, Exception: crash}, **kwargs)
        self._model_calls, self._http_error, self._crash = model_calls, http_error, crash

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = match_model_call(scope, self._model_calls)
        if found is None:
            await super().__call__(scope, receive, send)
            return
        endpoint, params = found
        scope["app"], scope["router"], scope["path_params"] = self, self.router, params
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except HTTPException as exc:
            response = await self._http_error(request, exc)
        except Exception as exc:
            await (await self._crash(request, exc))(scope, receive, send)
            raise
        await response(scope, receive, send)


def match_model_call(scope: Scope, calls: dict[str, Endpoint]) -> tuple[Endpoint, dict[str, str]] | None:
    """The endpoint and path parameters of a model-call POST, matched as ``Route`` matches its path
    (``/v1/...`` or ``/rollouts/{rollout_id}/attempts/{attempt_id}/v1/...``, parameters without '/')."""
    if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
        return None
    path: str = scope["path"]
    endpoint = calls.get(path)
    if endpoint is not None:
        return endpoint, {}
    if not path.startswith("/rollouts/"):
        return None
    parts = path.split("/", 5)  # "", "rollouts", rollout_id, "attempts", attempt_id, the rest
    if len(parts) < 6 or parts[3] != "attempts" or not parts[2] or not parts[4]:
        return None
    endpoint = calls.get("/" + parts[5])
    return None if endpoint is None else (endpoint, {"rollout_id": parts[2], "attempt_id": parts[4]})
