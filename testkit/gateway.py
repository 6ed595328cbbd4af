"""Serve a gateway app on a free port in a background thread, for tests and notebooks.

    with running_gateway(app) as gw:
        client = openai.OpenAI(base_url=gw.openai_base_url, api_key="x")

``embedded_gateway_app(settings, ...)`` builds the usual app (embedded engine, Kafka publisher, the model's
text side) for end-to-end tests; the parts it uses are created inside the server's event loop.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette

from producers.gateway.app import Gateway
from producers.gateway.settings import GatewayStackSettings


@dataclass
class RunningGateway:
    url: str  # e.g. http://127.0.0.1:54321
    app: Starlette
    server: uvicorn.Server

    @property
    def gateway(self) -> Gateway:
        return self.app.state.gateway

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    def attempt_openai_base_url(self, rollout_id: str, attempt_id: str) -> str:
        return f"{self.url}/rollouts/{rollout_id}/attempts/{attempt_id}/v1"

    def attempt_anthropic_base_url(self, rollout_id: str, attempt_id: str) -> str:
        return f"{self.url}/rollouts/{rollout_id}/attempts/{attempt_id}"


@contextmanager
def running_gateway(app: Starlette, *, host: str = "127.0.0.1", port: int = 0,
                    startup_timeout_s: float = 120.0, log_level: str = "warning") -> Iterator[RunningGateway]:
    """Run ``app`` under uvicorn in a daemon thread; stop it (lifespan shutdown included) on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(app, host=host, port=bound_port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=30)
    server = uvicorn.Server(config)
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # surfaced to the caller below
            errors.append(exc)

    thread = threading.Thread(target=serve, name=f"gateway-{bound_port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if errors or not thread.is_alive():
            sock.close()
            raise RuntimeError(f"the gateway did not start: {errors[0] if errors else 'server exited'}")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"the gateway did not start within {startup_timeout_s} s")
        time.sleep(0.02)
    try:
        yield RunningGateway(f"http://{host}:{bound_port}", app, server)
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def embedded_gateway_app(settings: GatewayStackSettings, *, spool_dir: Path | str | None = None,
                         topics: dict[str, str] | None = None, text: Any = None, upstream: Any = None,
                         wrap_publisher: Callable[[Any], Any] | None = None, **option_overrides: Any) -> Starlette:
    """The standard app (embedded engine, Kafka publisher, the model's text side) from ``settings``.

    ``spool_dir`` gives the publisher its own spool (tests: a tmp dir); ``topics`` overrides topic names
    (``calls_topic``, ``env_topic``); ``upstream`` replaces the embedded engine; ``wrap_publisher`` wraps the
    Kafka publisher (e.g. to observe deliveries); ``option_overrides`` set GatewayOptions fields
    (``prefix_mode``, ``unattributed``, ``max_tokens_limit``, ``max_body_bytes``, ``admin_key``, ...).
    """
    from dataclasses import replace

    from producers.delivery import CallPublisher
    from producers.gateway.options import GatewayOptions
    from producers.gateway.wiring import build_app
    from schemas.kafka.config import producer_config

    options = replace(GatewayOptions.from_settings(settings), **option_overrides)
    publisher: Any = CallPublisher(producer_config(settings.kafka), spool_dir or settings.gateway.spool_dir,
                              settings.gateway.delivery_timeout_s)
    if wrap_publisher is not None:
        publisher = wrap_publisher(publisher)
    # Tests pin the base policy: a policy store left by a local demo run must not change the engine.
    return build_app(settings, publisher=publisher, text=text, upstream=upstream, options=options, topics=topics,
                     progress=lambda _: None, policy_dir=None)


@contextmanager
def running_embedded_gateway(settings: GatewayStackSettings, **kwargs: Any) -> Iterator[RunningGateway]:
    """``running_gateway(embedded_gateway_app(settings, **kwargs))``: the reusable end-to-end fixture.

        with running_embedded_gateway(settings, spool_dir=tmp_path / "spool") as gw:
            with Rollout(gw.url, task_input=...) as rollout:
                client = openai.OpenAI(base_url=rollout.openai_base_url, api_key=rollout.api_key)
    """
    with running_gateway(embedded_gateway_app(settings, **kwargs)) as gw:
        yield gw
