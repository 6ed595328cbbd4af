"""The direct route of model calls (app.GatewayApp) serves exactly what Starlette's router would: the same
paths with the same path parameters, everything else left to Starlette, and the same exception handling."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route
from starlette.testclient import TestClient

from producers.gateway.app import ATTEMPT_PREFIX
from producers.gateway.asgi_app import GatewayApp, match_model_call

PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"]


async def _echo(request: Request) -> Response:
    if request.headers.get("x-fail") == "http":
        raise HTTPException(418, "teapot")
    if request.headers.get("x-fail") == "crash":
        raise RuntimeError("boom")
    body = (await request.body()).decode()
    return JSONResponse({"path": request.url.path, "params": request.path_params, "body": body})


async def _other(request: Request) -> Response:
    return JSONResponse({"other": request.url.path})


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"error": exc.detail, "status": exc.status_code}, status_code=exc.status_code)


async def _crash(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": f"internal: {exc!r}"}, status_code=500)


def _app() -> GatewayApp:
    routes = [Route("/v1/models", _other, methods=["GET"]),
              Route("/v1/rollouts/{rid}/attempts", _other, methods=["POST"])]
    for path in PATHS:
        routes += [Route(path, _echo, methods=["POST"]), Route(ATTEMPT_PREFIX + path, _echo, methods=["POST"])]
    return GatewayApp(routes=routes, model_calls=dict.fromkeys(PATHS, _echo), http_error=_http_error, crash=_crash)


CANDIDATES = [*PATHS, *(f"/rollouts/r-1/attempts/a%202{p}" for p in PATHS),
              "/rollouts/r/attempts/a/b/v1/messages", "/rollouts//attempts/a/v1/messages",
              "/rollouts/r/attempts//v1/messages", "/rollouts/r/attempt/a/v1/messages", "/v1/chat/completions/",
              "/v1/models", "/v1/rollouts/r/attempts", "/rollouts/r/attempts/a", "/v1/messagesx",
              "/rollouts/r/attempts/a/v1/chat/completions/extra"]


@pytest.mark.parametrize("path", CANDIDATES)
@pytest.mark.parametrize("method", ["POST", "GET"])
def test_it_matches_what_the_routes_match(path: str, method: str) -> None:
    scope: dict[str, Any] = {"type": "http", "method": method, "path": path, "root_path": ""}
    found = match_model_call(scope, dict.fromkeys(PATHS, _echo))
    full = [r for r in _app().routes if isinstance(r, Route) and r.endpoint is _echo
            and r.matches(scope)[0] == Match.FULL]
    if found is None:
        assert not full
    else:
        assert len(full) == 1 and found[1] == full[0].matches(scope)[1]["path_params"]


def test_calls_answer_as_through_starlette_and_the_rest_goes_there() -> None:
    with TestClient(_app()) as client:
        answer = client.post("/rollouts/r-1/attempts/a-2/v1/messages", content=b"hi")
        assert answer.json() == {"path": "/rollouts/r-1/attempts/a-2/v1/messages",
                                 "params": {"rollout_id": "r-1", "attempt_id": "a-2"}, "body": "hi"}
        assert client.post("/v1/chat/completions", content=b"x").json()["params"] == {}
        assert client.get("/v1/models").json() == {"other": "/v1/models"}
        assert client.get("/v1/chat/completions").status_code == 405  # Starlette's answer for the wrong method
        teapot = client.post("/v1/responses", headers={"x-fail": "http"})
        assert (teapot.status_code, teapot.json()) == (418, {"error": "teapot", "status": 418})
        with pytest.raises(RuntimeError, match="boom"):  # raised on, as ServerErrorMiddleware does
            client.post("/v1/completions", headers={"x-fail": "crash"})
    with TestClient(_app(), raise_server_exceptions=False) as client:
        crashed = client.post("/v1/completions", headers={"x-fail": "crash"})
        assert (crashed.status_code, crashed.json()) == (500, {"error": "internal: RuntimeError('boom')"})
