"""Large request bodies are checked in a separate process before the event loop parses them (issue 29, fault (o)).

Parsing JSON runs on the serving event loop, and its cost is out of proportion to the bytes for a body of tens of
thousands of tiny objects: 2.7 MB of Anthropic tool blocks took the loop about 0.3 s to parse and as much again
to count, while every other call on the worker waited, only to be refused for its length. A body of at least
``gateway.offload_body_bytes`` is first decoded, parsed and measured against the model's context
(``prompt_bound.min_prompt_tokens_raw``) by a small process pool; only a body that passes is parsed on the loop,
and such a body is bounded by the context, so its parse is work the call needs anyway. A refusal comes back
as the same error, in the caller's protocol, that the loop would have given.

The pool's queue is bounded (``gateway.body_check_queue`` bodies waiting or in progress per gateway process):
past it a large body is refused at once with 503 ``overloaded`` rather than held in memory behind others.
Processes are spawned (the gateway has threads), lazily or by ``warm`` when the gateway starts serving.

Every route that takes a JSON body reads it through ``BodyChecks.read_json`` (model calls, count_tokens, the
environment routes, feedback, session ends, forget requests), so each large body is checked here first, with
the route's own rule: a model call's structure against the context (``StructureLimit``), and for the other
routes their request model, validated here as on the loop (``model``: a pydantic class, or a function of the
parsed body that names one), so a hostile body on any route is refused without costing the loop its parse. A
body that passes is still parsed on the loop (it is bounded by ``gateway.max_body_bytes``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request

from producers.gateway.body import parse_json_object, read_limited, validate
from producers.gateway.errors import GatewayError
from producers.gateway.prompt_bound import StructureLimit

# What a route's body must be beyond a JSON object: its request model, or a function of the parsed body that
# names the model (module level, so the pool can unpickle it by name).
BodyModel = type[BaseModel] | Callable[[dict[str, Any]], type[BaseModel]]

log = logging.getLogger(__name__)


def check_body(raw: bytes, limit: StructureLimit | None, model: BodyModel | None = None) -> dict[str, Any] | None:
    """In the pool: the refusal of ``raw`` as GatewayError fields, or None when the loop may parse it.
    Pure, and the same checks in the same order as on the loop (body.parse_json_object, then the structure,
    then the route's model)."""
    from producers.gateway.prompt_bound import min_prompt_tokens_raw, structure_error

    try:
        body = parse_json_object(raw)
        if limit is not None:
            error = structure_error(min_prompt_tokens_raw(body, limit.max_token_bytes), limit.context)
            if error is not None:
                raise error
        if model is not None:
            validate(model if isinstance(model, type) else model(body), body)
    except GatewayError as exc:
        return {"status": exc.status, "message": exc.message, "kind": exc.kind, "param": exc.param,
                "code": exc.code}
    return None


def _exit_with_parent(parent: int) -> None:
    """In the pool, at start: exit when the gateway process is gone. A gateway worker killed with -9 (a
    supervisor's restart, the OOM killer) cannot shut its pool down, and a spawned check process would
    otherwise live on, orphaned, for as long as the machine does."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _ready() -> bool:
    """In the pool: import what ``check_body`` needs, once, at start."""
    return check_body(b"{}", None) is None


class BodyChecks:
    """The pool and its bounded queue; ``min_bytes`` 0 or ``processes`` 0: every body is left to the loop."""

    def __init__(self, min_bytes: int, processes: int = 1, queue: int = 4) -> None:
        self.min_bytes = min_bytes
        self.processes = processes
        self.queue = queue
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._waiting = 0
        self.checked = 0  # bodies checked in the pool (ever)
        self.refused = 0  # of which refused there

    @property
    def enabled(self) -> bool:
        return self.min_bytes > 0 and self.processes > 0

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                self.processes, mp_context=multiprocessing.get_context("spawn"),
                initializer=_exit_with_parent, initargs=(os.getpid(),))
        return self._pool

    def warm(self) -> None:
        """Start the processes now (their imports take a second), not on the first large body."""
        if self.enabled:
            for _ in range(self.processes):
                self._executor().submit(_ready)

    async def read_json(self, request: Request, max_bytes: int, *, limit: StructureLimit | None = None,
                        model: BodyModel | None = None, allow_empty: bool = False) -> dict[str, Any]:
        """The request's body as a JSON object (``{}`` for an empty one when ``allow_empty``): read within
        ``max_bytes``, checked first off the loop when large (``check``), then parsed here. Every route's way
        to its body; the route still validates its model on what this returns."""
        raw = await read_limited(request, max_bytes)
        if allow_empty and not raw.strip():
            return {}
        await self.check(raw, limit, model)
        return parse_json_object(raw)

    async def check(self, raw: bytes, limit: StructureLimit | None, model: BodyModel | None = None) -> None:
        """Raise the GatewayError the loop would raise for ``raw`` (bad UTF-8 or JSON, not an object, a
        structure longer than the context, a body its route's model refuses), checked in the pool when ``raw``
        is large; else return."""
        if not self.enabled or len(raw) < self.min_bytes:
            return
        if self._waiting >= self.queue:
            raise GatewayError(503, f"{self._waiting} large request bodies (of {self.min_bytes:,} bytes or more) are "
                               "being checked on this gateway process; retry shortly", "overloaded",
                               code="overloaded")
        self._waiting += 1
        try:
            refusal = await asyncio.wrap_future(self._executor().submit(check_body, raw, limit, model))
        except concurrent.futures.process.BrokenProcessPool:  # a check process died: a new pool next time
            log.warning("a body check process died; this body is checked on the event loop")
            self._pool = None
            return
        finally:
            self._waiting -= 1
        self.checked += 1
        if refusal is not None:
            self.refused += 1
            raise GatewayError(refusal["status"], refusal["message"], refusal["kind"], param=refusal["param"],
                               code=refusal["code"])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
