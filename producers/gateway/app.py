"""The gateway's ASGI app: OpenAI and Anthropic protocol routes, the environment API, health, metrics.

Every model route is served at ``/v1/...`` and again under ``/rollouts/{rollout_id}/attempts/{attempt_id}``
so that a harness can be pointed at one attempt by its base URL alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import Gauge
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from producers.gateway import anthropic_adapter, openai_adapter, records, responses_adapter
from producers.gateway.asgi_app import Endpoint, GatewayApp
from producers.gateway.attempts import AttemptRegistry
from producers.gateway.body import validate
from producers.gateway.body_checks import BodyChecks
from producers.gateway.chat import CallOutcome, InternalCall, SamplingSpec
from producers.gateway.context import GatewayContext
from producers.gateway.env_api import EnvApi
from producers.gateway.errors import GatewayError, Protocol, internal_error
from producers.gateway.feedback_api import FeedbackApi
from producers.gateway.forget_api import ForgetApi
from producers.gateway.heap import serving_heap
from producers.gateway.identity import (
    CallIdentity,
    check_any_key,
    is_admin,
    presented_key,
    resolve_named,
    resolve_unattributed,
    session_id_of,
    traffic_label_of,
)
from producers.gateway.live_text import LiveText
from producers.gateway.metrics import GatewayMetrics
from producers.gateway.models_anthropic import CountTokensRequest, MessagesRequest
from producers.gateway.models_openai import ChatCompletionRequest, CompletionRequest
from producers.gateway.models_responses import ResponsesRequest
from producers.gateway.options import GatewayOptions
from producers.gateway.ports import TextSide
from producers.gateway.recovery import KafkaRecoverySource, RecoveryReport, recover
from producers.gateway.release_routed import public_release_status
from producers.gateway.service import CallService, ErrorBody, PreparedCall, ResponseBuilder
from producers.gateway.session_refs import SessionRefs
from producers.gateway.sessions import OrganicSessions, session_key
from producers.gateway.settings import GatewayStackSettings
from producers.gateway.sse import SSE_HEADERS
from producers.gateway.tenants import Tenants
from producers.upstreams.base import Upstream
from schemas.codec import Codec, get_codec
from schemas.kafka.key_store import ForgetSettings
from schemas.subject_names import SubjectNames
from schemas.tokens import TokenIds

log = logging.getLogger("tokentrail.gateway")

ATTEMPT_PREFIX = "/rollouts/{rollout_id}/attempts/{attempt_id}"
PING_INTERVAL_S = 10.0
SHUTDOWN_GRACE_S = 30.0


class OrjsonResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


@dataclass(frozen=True)
class ModelRoute:
    """How a model route reads its request and turns it into the internal chat form."""

    model: type[BaseModel]
    to_internal: Callable[[Any, int], InternalCall]
    adapter_version: str
    tool_call_prefix: str
    protocol: Protocol  # the shape of its errors
    call_protocol: str  # its label on records and metrics


CHAT_ROUTE = ModelRoute(ChatCompletionRequest, openai_adapter.chat_to_internal, openai_adapter.ADAPTER_VERSION,
                        openai_adapter.TOOL_CALL_PREFIX, "openai", openai_adapter.CHAT_PROTOCOL)
COMPLETIONS_ROUTE = ModelRoute(CompletionRequest, openai_adapter.completion_to_internal,
                               openai_adapter.ADAPTER_VERSION, openai_adapter.TOOL_CALL_PREFIX, "openai",
                               openai_adapter.COMPLETIONS_PROTOCOL)
RESPONSES_ROUTE = ModelRoute(ResponsesRequest, responses_adapter.to_internal, responses_adapter.ADAPTER_VERSION,
                             responses_adapter.TOOL_CALL_PREFIX, "openai", responses_adapter.PROTOCOL)
MESSAGES_ROUTE = ModelRoute(MessagesRequest, anthropic_adapter.to_internal, anthropic_adapter.ADAPTER_VERSION,
                            anthropic_adapter.TOOL_CALL_PREFIX, "anthropic", anthropic_adapter.PROTOCOL)


class Gateway:
    """Holds the parts and serves the routes; ``create_app`` wraps it in a Starlette app."""

    def __init__(self, options: GatewayOptions, upstream: Upstream, publisher: Any, text: TextSide, *,
                 registry: AttemptRegistry | None = None, metrics: GatewayMetrics | None = None,
                 codec: Codec | None = None, topics: dict[str, str] | None = None,
                 subjects: SubjectNames | None = None) -> None:
        if options.unattributed not in ("record", "refuse"):
            raise ValueError("gateway.unattributed must be 'record' or 'refuse', "
                             f"not {options.unattributed!r}")
        self.options, self.upstream, self.publisher, self.text = options, upstream, publisher, text
        self.metrics = metrics or GatewayMetrics()
        self.ctx = GatewayContext(registry=registry or options.make_registry(), publisher=publisher,
                                  codec=codec or get_codec(), metrics=self.metrics,
                                  admin_key=options.admin_key, require_auth=options.require_auth,
                                  unattributed=options.unattributed, max_body_bytes=options.max_body_bytes,
                                  tenants=Tenants(dict(options.tenant_keys), options.tenant_max_open_sessions),
                                  body_checks=BodyChecks(options.offload_body_bytes, options.body_check_processes,
                                                         options.body_check_queue),
                                  **({"subjects": subjects} if subjects is not None else {}), **(topics or {}))
        self.service = CallService(self.ctx, upstream, text, model_name=options.model_name,
                                   model_aliases=options.model_aliases, prefix_mode=options.prefix_mode)
        self.env_api = EnvApi(self.ctx)
        self.body_checks = self.ctx.body_checks  # every route's body is read through it (body_checks.py)
        if options.organic_sessions and options.session_idle_s >= options.attempt_idle_timeout_s:
            raise ValueError("gateway.session_idle_s must be below gateway.attempt_idle_timeout_s (an organic "
                             "session would be dropped unfinished before it ends)")
        self.session_refs = SessionRefs(options.session_ref_key)
        if options.organic_sessions and self.session_refs.is_dev_key:
            log.warning("organic sessions: session refs are keyed with the DEV-ONLY key; set "
                        "TOKENTRAIL_GATEWAY__SESSION_REF_KEY")
        self.sessions = (OrganicSessions(self.env_api, options.session_idle_s, self.session_refs)
                         if options.organic_sessions else None)
        self.forget_api: ForgetApi | None = None  # POST /v1/admin/forget, where the app has Kafka settings
        self._tasks: set[asyncio.Task[Any]] = set()
        self.metrics.watch_attempts(lambda: self.ctx.registry.counts()["active"])
        self._watch_registry_memory()
        self.recovery: RecoveryReport | None = None
        if hasattr(publisher, "spool_depth"):
            self.metrics.watch_spool(lambda: float(publisher.spool_depth))
        self.fingerprint = f"tt-{text.tokenizer_fingerprint[:8]}-{text.chat_template_fingerprint[:8]}"

    def _watch_registry_memory(self) -> None:
        registry, r = self.ctx.registry, self.metrics.registry
        Gauge("tokentrail_gateway_registry_bytes", "Bytes the attempt registry keeps (prompts, outputs, "
              "starts, tombstones), counted against gateway.registry_max_bytes", registry=r
              ).set_function(lambda: float(registry.bytes_used))
        Gauge("tokentrail_gateway_registry_max_bytes", "The attempt registry's memory budget",
              registry=r).set_function(lambda: float(registry.max_bytes))
        Gauge("tokentrail_gateway_registry_shed_bytes", "Bytes given back under memory pressure (ever)",
              registry=r).set_function(lambda: float(registry.shed_bytes))
        Gauge("tokentrail_gateway_expired_attempts", "Unfinished attempts dropped after being idle (ever)",
              registry=r).set_function(lambda: float(registry.expired_count))

    async def recover(self, source: KafkaRecoverySource, progress: Callable[[str], None]) -> RecoveryReport:
        """Rebuild open attempts from Kafka before serving (recovery.py)."""
        async def deliver_call(record: dict[str, Any]) -> None:
            await self.ctx.deliver(self.ctx.calls_topic, record["rollout_id"], "CallRecord", record)

        self.recovery = await recover(self.ctx.registry, self.publisher, source, progress, deliver_call)
        if self.sessions is not None:
            self.sessions.adopt()  # rebuilt organic attempts still end when idle
        return self.recovery

    # -- routes ----------------------------------------------------------------------------------

    def model_calls(self) -> dict[str, Endpoint]:
        """The POST routes of model calls by path (under ``/v1`` and under an attempt's prefix)."""
        return {"/v1/chat/completions": self.chat_completions, "/v1/completions": self.completions,
                "/v1/messages": self.messages, "/v1/messages/count_tokens": self.count_tokens,
                "/v1/responses": self.responses}

    def routes(self) -> list[Route]:
        model_routes = [(path, endpoint, ["POST"]) for path, endpoint in self.model_calls().items()]
        model_routes.append(("/v1/models", self.models, ["GET"]))
        routes = [Route("/health", self.health, methods=["GET"]),
                  Route("/metrics", self.metrics_endpoint, methods=["GET"]),
                  *self.env_api.routes(), *FeedbackApi(self.ctx, self.session_refs).routes(),
                  *(self.sessions.routes() if self.sessions is not None else []),
                  *(self.forget_api.routes() if self.forget_api is not None else [])]
        for path, endpoint, methods in model_routes:
            routes.append(Route(path, endpoint, methods=methods))
            routes.append(Route(ATTEMPT_PREFIX + path, endpoint, methods=methods))
        return routes

    async def health(self, request: Request) -> Response:
        body: dict[str, Any] = {"status": "ok", "model": self.options.model_name,
                                "upstream": self.upstream.name, "attempts": self.ctx.registry.counts(),
                                "registry_memory": self.ctx.registry.memory(),
                                "calls_in_flight": len(self._tasks)}
        caches = getattr(self.text, "cache_memory", None)
        if caches is not None:  # the text side's caches, each bounded in bytes
            body["text_caches"] = caches()
        if self.recovery is not None:
            body["recovery"] = self.recovery.as_dict()
        if self.sessions is not None:
            body["organic_sessions"] = self.sessions.counts()
        release = getattr(self.upstream, "release_status", None)  # set when the gateway follows a release
        if release is not None:
            body["release"] = release()
            if self.options.admin_key and not is_admin(presented_key(request.headers), self.options.admin_key):
                # The release id salts the routing hash and the plan says which labels pin what: with them a
                # caller could pick session ids that land on the candidate. /health is open; they are the admin's.
                body["release"] = public_release_status(body["release"])
        if hasattr(self.publisher, "stats"):
            stats = self.publisher.stats()
            body["sink"] = {"spool_depth": stats.spool_depth, "kafka_reachable": stats.kafka_reachable,
                            "delivery_errors": stats.delivery_errors, "quarantined": stats.quarantined}
        return OrjsonResponse(body)

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    async def models(self, request: Request) -> Response:
        name = self.options.model_name
        try:
            check_any_key(request.headers, self.ctx.registry, require_auth=self.options.require_auth,
                          admin_key=self.options.admin_key)
        except GatewayError as exc:
            protocol: Protocol = "anthropic" if "anthropic-version" in request.headers else "openai"
            return OrjsonResponse(exc.body(protocol), status_code=exc.status)
        if "anthropic-version" in request.headers:
            entry = {"type": "model", "id": name, "display_name": name, "created_at": "1970-01-01T00:00:00Z"}
            return OrjsonResponse({"data": [entry], "has_more": False, "first_id": name, "last_id": name})
        return OrjsonResponse({"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                                           "owned_by": "tokentrail"}]})

    # -- OpenAI ----------------------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        admitted = await self._admit(request, CHAT_ROUTE)
        if isinstance(admitted, Response):
            return admitted
        req, prep = admitted
        token_text, fp = self.text.token_text, self.fingerprint

        def respond(outcome: CallOutcome) -> dict[str, Any]:
            return openai_adapter.chat_response(outcome, req, token_text, fp)

        if req.stream:
            fmt = openai_adapter.ChatStream(req, prep.shown_id, req.model, prep.received_at_us // 1_000_000,
                                            token_text, fp)
            return self._stream(prep, fmt, respond, GatewayError.openai_body, ping=None)
        return await self._unary(prep, respond, GatewayError.openai_body)

    async def responses(self, request: Request) -> Response:
        """OpenAI Responses API: converted to the internal chat form, then the same path as chat."""
        admitted = await self._admit(request, RESPONSES_ROUTE)
        if isinstance(admitted, Response):
            return admitted
        req, prep = admitted

        def respond(outcome: CallOutcome) -> dict[str, Any]:
            return responses_adapter.response_body(outcome, req)

        if req.stream:
            fmt = responses_adapter.ResponseStream(req, prep.shown_id, prep.received_at_us // 1_000_000)
            return self._stream(prep, fmt, respond, GatewayError.openai_body, ping=None)
        return await self._unary(prep, respond, GatewayError.openai_body)

    async def completions(self, request: Request) -> Response:
        admitted = await self._admit(request, COMPLETIONS_ROUTE)
        if isinstance(admitted, Response):
            return admitted
        req, prep = admitted
        token_text, fp = self.text.token_text, self.fingerprint

        def respond(outcome: CallOutcome) -> dict[str, Any]:
            return openai_adapter.completion_response(outcome, req, token_text, fp)

        if req.stream:
            fmt = openai_adapter.CompletionStream(req, prep.shown_id, req.model, prep.received_at_us // 1_000_000,
                                                  token_text, fp)
            return self._stream(prep, fmt, respond, GatewayError.openai_body, ping=None, raw_text=True)
        return await self._unary(prep, respond, GatewayError.openai_body)

    # -- Anthropic -------------------------------------------------------------------------------

    async def messages(self, request: Request) -> Response:
        admitted = await self._admit(request, MESSAGES_ROUTE)
        if isinstance(admitted, Response):
            return admitted
        req, prep = admitted
        if req.stream:
            fmt = anthropic_adapter.MessageStream(prep.shown_id, req.model)
            return self._stream(prep, fmt, anthropic_adapter.message_response, GatewayError.anthropic_body,
                                ping=anthropic_adapter.MessageStream.ping())
        return await self._unary(prep, anthropic_adapter.message_response, GatewayError.anthropic_body)

    async def count_tokens(self, request: Request) -> Response:
        try:
            named = self._named(request)
            # Counted only within the context, as a call is: an over-long structure is refused before rendering.
            raw = await self.body_checks.read_json(request, self.options.max_body_bytes, model=CountTokensRequest,
                                                   limit=self.service.structure_limit())
            self.service.check_structure(raw)
            req = validate(CountTokensRequest, raw)
            identity = named or self._unnamed(request, raw, "anthropic")
            self.service.check_model(req.model)
            messages, tools = anthropic_adapter.conversation(req)
            call = InternalCall(protocol=anthropic_adapter.PROTOCOL, model=req.model, stream=False,
                                sampling=SamplingSpec(), messages=messages, tools=tools)
            count = self.service.count_tokens(identity, call)
        except GatewayError as exc:
            return self._refuse(exc, "anthropic", anthropic_adapter.PROTOCOL)
        return OrjsonResponse({"input_tokens": count})

    # -- shared ----------------------------------------------------------------------------------

    async def _admit(self, request: Request, route: ModelRoute) -> tuple[Any, PreparedCall] | Response:
        """Identity, body, model and conversion checks, then render and index the call: the request
        model and the prepared call, or the refusal as an error response in the route's protocol."""
        received = records.now_us()
        try:
            named = self._named(request)
            # A large body is parsed and measured off the loop first (body_checks.py).
            raw = await self.body_checks.read_json(request, self.options.max_body_bytes,
                                                   limit=self.service.structure_limit())
            # Timings run from the body's end: a client that trickles its body must not make the policy that
            # serves it look slow (the release controller compares total_ms between versions).
            started = time.perf_counter()
            self.service.check_structure(raw)  # a body too long for the context costs no validation
            req = validate(route.model, raw)
            self.service.check_model(req.model)
            call = route.to_internal(req, self.options.max_tokens_limit)
            # An organic session's first call starts its attempt here (its start on Kafka first); nothing
            # is awaited after this until the call has its index, so a sweep cannot end it in between.
            identity = named or await self._organic(request, raw, route.protocol) \
                or self._unnamed(request, raw, route.protocol)
            prep = self._prepare(request, identity, call, raw, received, started,
                                 route.adapter_version, route.tool_call_prefix)
            self._remember_tenant_call(request, prep)
        except GatewayError as exc:
            return self._refuse(exc, route.protocol, route.call_protocol)
        return req, prep

    def _remember_tenant_call(self, request: Request, prep: PreparedCall) -> None:
        """A call in a tenant's own window: the tenant may post feedback on it (its call or response id). Its
        responses carry its call ref (the call id and its tenant's keyed tag), which any process checks."""
        tenant = self.ctx.tenants.of(presented_key(request.headers)) if self.ctx.tenants else None
        if tenant is not None and self.session_refs.owned_by(prep.identity.rollout_id, tenant):
            self.ctx.tenants.remember_call(prep.call_id, tenant)
            prep.response_ref = self.session_refs.call_ref(prep.call_id, tenant)

    def _named(self, request: Request) -> CallIdentity | None:
        """The attempt the call names (path, headers, minted key), None when it names none (identity.py)."""
        return resolve_named(request.path_params, request.headers, self.ctx.registry,
                             require_auth=self.options.require_auth, admin_key=self.options.admin_key,
                             tenants=self.ctx.tenants, ref_of=self.session_refs.ref)

    async def _organic(self, request: Request, raw: dict[str, Any], protocol: Protocol) -> CallIdentity | None:
        """The organic session's attempt (started if it has none), None when off or there is no key."""
        found = self._session_key(request, raw, protocol)
        if found is None or self.sessions is None:
            return None
        state = await self.sessions.attempt_for(*found)
        return CallIdentity(state, "session", self._session_id(request, found[0]))

    def _session_key(self, request: Request, raw: dict[str, Any], protocol: Protocol) -> tuple[str, str] | None:
        if self.sessions is None:
            return None
        found = session_key(request.headers, raw, protocol, self.options.session_key_sources, self.options.admin_key)
        presented = presented_key(request.headers)
        tenant = self.ctx.tenants.of(presented) if self.ctx.tenants else None
        if found is None or tenant is None:
            if found is not None and Tenants.tenant_of_session(found[0]) and not is_admin(presented,
                                                                                         self.options.admin_key):
                raise GatewayError(403, "session keys beginning 'tenant:' are the tenants' own", "permission",
                                   code="wrong_tenant")  # else a caller could name itself into a tenant's session
            return found
        return Tenants.scope(tenant, found[0]), found[1]  # a tenant's sessions live in its own namespace

    def _session_id(self, request: Request, key: str) -> str | None:
        """The harness session id as the call records it: its keyed ref (session_refs.py). A tenant's is in its
        tenant's namespace too, so the feedback join's SESSION targets (CallRecord.session_id) reach only that
        tenant's calls (feedback_api.py)."""
        session = session_id_of(request.headers)
        if session is None:
            return None
        tenant = Tenants.tenant_of_session(key)
        return self.session_refs.ref(session if tenant is None else Tenants.scope(tenant, session))

    def _unnamed(self, request: Request, raw: dict[str, Any], protocol: Protocol) -> CallIdentity:
        """A call that names no attempt and starts none: its session's live organic attempt if there is one
        (count_tokens renders with its history), else the unattributed pseudo-attempt (or a refusal)."""
        found = self._session_key(request, raw, protocol)
        state = self.sessions.current(found[0]) if found is not None and self.sessions is not None else None
        if state is not None:
            return CallIdentity(state, "session", self._session_id(request, found[0] if found else ""))
        return resolve_unattributed(request.headers, self.ctx.registry, unattributed=self.options.unattributed,
                                    ref_of=self.session_refs.ref)

    def _prepare(self, request: Request, identity: CallIdentity, call: InternalCall, raw: dict[str, Any],
                 received: int, started: float, adapter_version: str, tool_prefix: str) -> PreparedCall:
        # Path and query as ``request.url`` gives them, without building and re-parsing a whole URL.
        scope = request.scope
        path = scope["path"].replace("?", "%3F").replace("#", "%23").replace("\\", "%5C")
        request_json = records.request_json(request.method, path, scope.get("query_string", b"").decode(),
                                            dict(request.headers), raw)
        return self.service.prepare(identity, call, received_at_us=received, started=started,
                                    request_json=request_json, adapter_version=adapter_version,
                                    tool_call_prefix=tool_prefix, traffic_label=traffic_label_of(
                                        request.headers, self.options.admin_key, self.options.traffic_label_key))

    def _refuse(self, exc: GatewayError, protocol: Protocol, call_protocol: str) -> Response:
        self.metrics.refused.labels(call_protocol, str(exc.status)).inc()
        return OrjsonResponse(exc.body(protocol), status_code=exc.status)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        """Calls run in their own task: a harness that goes away does not cancel recording."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _unary(self, prep: PreparedCall, respond: ResponseBuilder, error_body: ErrorBody) -> Response:
        task = self._spawn(self.service.run(prep, respond, error_body))
        try:
            _, response = await asyncio.shield(task)
        except GatewayError as exc:
            return OrjsonResponse(error_body(exc), status_code=exc.status)
        return OrjsonResponse(response)

    def _stream(self, prep: PreparedCall, fmt: Any, respond: ResponseBuilder, error_body: ErrorBody, *,
                ping: bytes | None, raw_text: bool = False) -> Response:
        """SSE: text streams as it is sampled; the final events follow the record's delivery."""
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        abort = asyncio.Event()
        holdback = max((len(s) for s in prep.call.sampling.stop), default=1) - 1
        live = LiveText(self.text, fmt, queue.put_nowait, holdback=holdback, raw_text=raw_text,
                        template_kwargs=prep.call.template_kwargs or None)
        started: list[bool] = []

        def start(prompt_ids: TokenIds) -> None:
            # The opening events carry the prompt (its length, or its ids): in pass-through they wait
            # until the upstream says what it rendered, before any text.
            if not started:
                started.append(True)
                for frame in fmt.start(prompt_ids):
                    queue.put_nowait(frame)

        async def produce() -> None:
            try:
                outcome, _ = await self.service.run(prep, respond, error_body, on_text=live.update,
                                                    abort=abort, on_prompt=start)
                start(outcome.prompt_ids)
                frames = live.finish(outcome) + fmt.finish(outcome)
            except GatewayError as exc:
                frames = fmt.error(exc)
            except Exception as exc:  # never leave the stream hanging
                frames = fmt.error(internal_error(f"in the stream of call {prep.call_id}", log, exc))
            for frame in frames:
                queue.put_nowait(frame)
            queue.put_nowait(None)

        if not prep.passthrough:
            start(prep.rendered.prompt_ids)
        task = self._spawn(produce())

        async def frames() -> AsyncIterator[bytes]:
            try:
                while True:
                    try:
                        frame = await asyncio.wait_for(queue.get(), PING_INTERVAL_S)
                    except TimeoutError:
                        if ping is not None:
                            yield ping
                        else:
                            yield b": keep-alive\n\n"
                        continue
                    if frame is None:
                        return
                    yield frame
            finally:
                if not task.done():
                    abort.set()  # the harness went away: stop sampling, record what was sampled

        return StreamingResponse(frames(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def drain(self, timeout_s: float = SHUTDOWN_GRACE_S) -> None:
        """Wait for calls in flight to be recorded (shutdown)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)


def _error_protocol(path: str) -> Protocol:
    if "/messages" in path:
        return "anthropic"
    return "env" if path.startswith("/v1/rollouts") else "openai"


def create_app(settings: GatewayStackSettings, upstream: Upstream, publisher: Any, renderer: TextSide, *,
               options: GatewayOptions | None = None, registry: AttemptRegistry | None = None,
               topics: dict[str, str] | None = None, manage_publisher: bool = True,
               close_upstream: bool = False, policy_dir: Path | None = None,
               recovery: KafkaRecoverySource | None = None,
               progress: Callable[[str], None] = log.info) -> Starlette:
    """The ASGI app. ``renderer`` is the model's text side (see ports.TextSide / text_side.py).

    With ``manage_publisher`` the app starts the publisher (``await publisher.start()``) when it starts serving and
    closes it on shutdown, after calls in flight are recorded; ``close_upstream`` closes the upstream too.
    ``topics`` overrides topic names (``calls_topic``, ``env_topic``), e.g. per test. With ``policy_dir``
    an upstream that can (the embedded engine) loads each new policy version the trainer publishes there.
    With ``recovery`` the open attempts are rebuilt from Kafka once the publisher runs, before serving.
    """
    forget = getattr(settings, "forget", None) or ForgetSettings()
    gateway = Gateway(options or GatewayOptions.from_settings(settings), upstream, publisher, renderer,
                      registry=registry, topics=topics, subjects=SubjectNames(forget.master()))
    gateway.forget_api = ForgetApi(gateway.ctx, settings.kafka, forget)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if manage_publisher and hasattr(publisher, "start"):
            await publisher.start()
        if recovery is not None:
            await gateway.recover(recovery, progress)
        follow = getattr(upstream, "follow_policies", None)
        if policy_dir is not None and follow is not None:
            from models.policy_store import PolicyStore

            follow(PolicyStore(policy_dir))
        # Organic sessions idle past their window end in the background, with no call to notice them.
        sweeper = asyncio.create_task(gateway.sessions.run_sweeper()) if gateway.sessions is not None else None
        with serving_heap():
            try:
                yield
            finally:
                if sweeper is not None:  # open sessions stay open: a restart rebuilds them (recovery.py)
                    sweeper.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await sweeper
                await gateway.drain()
                gateway.body_checks.close()
                if manage_publisher and hasattr(publisher, "close"):
                    await publisher.close()
                if close_upstream:
                    await upstream.close()

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found" if exc.status_code == 404 else "invalid_request"
        message = f"no route for {request.method} {request.url.path}" if exc.status_code in (404, 405) \
            else str(exc.detail)
        error = GatewayError(exc.status_code, message, kind)
        return OrjsonResponse(error.body(_error_protocol(request.url.path)), status_code=exc.status_code)

    async def crash(request: Request, exc: Exception) -> Response:
        error = internal_error(f"on {request.method} {request.url.path}", log, exc)
        return OrjsonResponse(error.body(_error_protocol(request.url.path)), status_code=500)

    app = GatewayApp(routes=gateway.routes(), lifespan=lifespan, model_calls=gateway.model_calls(),
                     http_error=http_error, crash=crash)
    app.state.gateway = gateway
    return app
