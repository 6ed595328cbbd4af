"""Environment ingestion: start rollout attempts, post their environment events, finish them.

``POST /v1/rollouts``                                   start a rollout (its first attempt)
``POST /v1/rollouts/{rid}/attempts``                    start the rollout's next attempt (a retry)
``GET  /v1/rollouts/{rid}/attempts/{aid}``              counters so far
``POST /v1/rollouts/{rid}/attempts/{aid}/events``       tool results, observations, state, artifacts
``POST /v1/rollouts/{rid}/attempts/{aid}/finish``       status and final artifacts

Each event is on Kafka (or the spool) before the response. The finish states how many calls and
events the attempt has; the gateway knows, because it assigned their indices.

Every record is built and encoded before it changes any state: a record that cannot be stored (too
deep to serialize, too large for Kafka) is refused with nothing taken (no event index, no finished
attempt), and a batch whose delivery fails gives its indices back, so its retry gets the same event ids.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from producers.gateway import records
from producers.gateway.attempt_state import AttemptState
from producers.gateway.body import validate
from producers.gateway.context import GatewayContext
from producers.gateway.errors import GatewayError, bad_request
from producers.gateway.identity import auth_required, check_attempt_key, is_admin, presented_key
from schemas.ids import call_id as make_call_id
from schemas.ids import env_event_id

MAX_EVENTS_PER_REQUEST = 1000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RolloutStart(_Strict):
    rollout_id: str | None = Field(default=None, min_length=1, max_length=200,
                                   pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
    task_input: Any = None
    group_id: str | None = Field(default=None, min_length=1, max_length=200)
    group_key: dict[str, str] = Field(default_factory=dict)
    expected_group_size: int | None = Field(default=None, ge=1)
    metadata: dict[str, Any] = Field(default_factory=dict)
    # Whose content this rollout carries (a user or tenant id): its records are written under that subject's
    # key and ``tokentrail forget`` can erase them (docs/forgetting.md). None: synthetic traffic, stored plain.
    # Records carry its keyed pseudonym, never the name (schemas/subject_names.py): callers put user ids here.
    subject: str | None = Field(default=None, min_length=1, max_length=200)
    # Tests only: completions the engine emits in order, one per model call of each attempt, instead of
    # sampling (the embedded engine; each record says ``scripted``, and nothing trains on it). A completion is
    # text (tokenized by the model's tokenizer) or its exact ids (a split a sampler could emit, not the
    # tokenizer's: what splicing exists for).
    script: list[str | list[Annotated[int, Field(ge=0)]]] | None = Field(default=None, max_length=1000)


class AttemptRetry(_Strict):
    metadata: dict[str, Any] | None = None


EventKind = Literal["STEP", "TOOL_RESULT", "OBSERVATION", "STATE", "ARTIFACT"]


class EnvEvent(_Strict):
    kind: EventKind
    payload: Any = None
    name: str | None = None
    call_id: str | None = None
    call_index: int | None = Field(default=None, ge=0)

    @field_validator("kind", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


class EventBatch(_Strict):
    events: list[EnvEvent] = Field(min_length=1, max_length=MAX_EVENTS_PER_REQUEST)


def events_model(raw: dict[str, Any]) -> type[BaseModel]:
    """What a POST .../events body is: a batch (``events``) or one event."""
    return EventBatch if "events" in raw else EnvEvent


class Finish(_Strict):
    status: Literal["SUCCESS", "FAILURE", "ABORTED"] = "SUCCESS"
    final_artifacts: Any = Field(default_factory=dict)

    @field_validator("status", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


def _built(build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A record from the request's JSON values; one they cannot make (e.g. nested deeper than the
    serializer goes) is the caller's error, a 400."""
    try:
        return build()
    except (TypeError, ValueError, OverflowError) as exc:
        raise bad_request(f"this request's values cannot be stored: {exc}") from exc


def _error(exc: GatewayError) -> JSONResponse:
    return JSONResponse(exc.body("env"), status_code=exc.status)


class EnvApi:
    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    def routes(self) -> list[Route]:
        base = "/v1/rollouts"
        return [
            Route(base, self.start_rollout, methods=["POST"]),
            Route(base + "/{rollout_id}/attempts", self.start_retry, methods=["POST"]),
            Route(base + "/{rollout_id}/attempts/{attempt_id}", self.attempt_status, methods=["GET"]),
            Route(base + "/{rollout_id}/attempts/{attempt_id}/events", self.post_events, methods=["POST"]),
            Route(base + "/{rollout_id}/attempts/{attempt_id}/finish", self.finish, methods=["POST"]),
        ]

    # -- auth --------------------------------------------------------------------------------------

    def _require_admin(self, request: Request) -> None:
        """Starting rollouts and retries needs the admin key, once one is set."""
        if self.ctx.admin_key and not is_admin(presented_key(request.headers), self.ctx.admin_key):
            raise GatewayError(401, "the environment API needs the gateway admin key", "authentication",
                               code="invalid_api_key")

    def _require_attempt_key(self, request: Request, state: AttemptState) -> None:
        """Status, events and finish accept the admin key or the attempt's own key, once keys are on
        (``admin_key``, or the deprecated ``require_auth``); keys compare as bytes (identity.keys_equal)."""
        if not auth_required(self.ctx.admin_key, self.ctx.require_auth):
            return
        check_attempt_key(self.ctx.registry, state, presented_key(request.headers), self.ctx.admin_key)

    # -- routes ------------------------------------------------------------------------------------

    async def start_rollout(self, request: Request) -> JSONResponse:
        try:
            self._require_admin(request)
            body = validate(RolloutStart, await self.ctx.body_checks.read_json(request, self.ctx.max_body_bytes,
                                                                                model=RolloutStart))
            start = body.model_dump(exclude={"rollout_id"})
            if body.subject is not None:
                start["subject"] = self.ctx.subjects.stored(body.subject)
            state = self.ctx.registry.start(body.rollout_id, start)
            return await self._announce(request, state, start, status_code=201)
        except GatewayError as exc:
            return _error(exc)

    async def start_retry(self, request: Request) -> JSONResponse:
        try:
            self._require_admin(request)
            raw = await self.ctx.body_checks.read_json(request, self.ctx.max_body_bytes, model=AttemptRetry,
                                                       allow_empty=True)
            retry = validate(AttemptRetry, raw)
            rid = request.path_params["rollout_id"]
            start = dict(self.ctx.registry.start_info(rid))
            if retry.metadata is not None:
                start["metadata"] = retry.metadata
            state = self.ctx.registry.start(rid, start)
            return await self._announce(request, state, start, status_code=201)
        except GatewayError as exc:
            return _error(exc)

    async def _announce(self, request: Request, state: AttemptState, start: dict[str, Any],
                        status_code: int) -> JSONResponse:
        record = await self.publish_start(state, start)
        root = str(request.base_url).rstrip("/")
        prefix = f"{root}/rollouts/{state.rollout_id}/attempts/{state.attempt_id}"
        return JSONResponse({
            "rollout_id": state.rollout_id, "attempt_id": state.attempt_id,
            "attempt_number": state.attempt_number, "api_key": state.api_key,
            "event_id": record["event_id"], "subject": state.subject,  # what its records carry
            # Hand one of these to a harness; each identifies the attempt on its own.
            "openai_base_url": f"{prefix}/v1", "anthropic_base_url": prefix,
            "gateway_url": root,
            "headers": {"X-Rollout-Id": state.rollout_id, "X-Attempt-Id": state.attempt_id},
        }, status_code=status_code)

    async def publish_start(self, state: AttemptState, start: dict[str, Any]) -> dict[str, Any]:
        """The AttemptStarted of a just-started attempt, on Kafka (or the spool) before this returns; an
        attempt whose start cannot be stored is forgotten again. Also how organic sessions start
        (sessions.py), so their starts are the same records as POST /v1/rollouts makes."""
        try:
            record = _built(lambda: records.attempt_started(
                rollout_id=state.rollout_id, attempt_id=state.attempt_id, attempt_number=state.attempt_number,
                group_id=start.get("group_id"), group_key=start.get("group_key") or {},
                expected_group_size=start.get("expected_group_size"), task_input=start.get("task_input"),
                metadata=start.get("metadata") or {}, subject=state.subject))
            value = await self.ctx.encode_ready("AttemptStarted", record, state.rollout_id)
            await self.ctx.deliver(self.ctx.env_topic, state.rollout_id, "AttemptStarted", record, value)
        except GatewayError:
            self.ctx.registry.abandon(state)
            raise
        return record

    async def attempt_status(self, request: Request) -> JSONResponse:
        rid, aid = request.path_params["rollout_id"], request.path_params["attempt_id"]
        try:
            state = self.ctx.registry.get_active(rid, aid, for_what="status request")
            self._require_attempt_key(request, state)
        except GatewayError as exc:
            if exc.code != "attempt_finished":
                return _error(exc)
            return JSONResponse({"rollout_id": rid, "attempt_id": aid, "finished": True})
        return JSONResponse({"rollout_id": rid, "attempt_id": aid, "finished": False,
                             "attempt_number": state.attempt_number, "calls": state.next_call_index,
                             "events": state.next_event_index, "calls_in_flight": state.in_flight})

    async def post_events(self, request: Request) -> JSONResponse:
        rid, aid = request.path_params["rollout_id"], request.path_params["attempt_id"]
        try:
            state = self.ctx.registry.get_active(rid, aid, for_what="event")
            self._require_attempt_key(request, state)
            raw = await self.ctx.body_checks.read_json(request, self.ctx.max_body_bytes, model=events_model)
            events = validate(EventBatch, raw).events if events_model(raw) is EventBatch else [validate(EnvEvent, raw)]
            for event in events:
                self._check_call_reference(state, event)
            await self.ctx.ready_to_seal("EnvStep", state.subject)  # before the indices are taken
            # Every record built and encoded first: one that cannot be stored refuses the batch whole.
            state.check_open("events")  # the body was awaited: the attempt may have finished meanwhile
            start = state.next_event_index
            built = []
            for index, event in enumerate(events, start):  # indices in request order
                eid = env_event_id(rid, aid, event.kind, index)
                cid = event.call_id if event.call_id is not None else (
                    make_call_id(rid, aid, event.call_index) if event.call_index is not None else None)
                record = _built(lambda e=event, i=index, eid=eid, cid=cid: records.env_step(
                    event_id_=eid, rollout_id=rid, attempt_id=aid, event_index=i, kind=e.kind, call_id=cid,
                    name=e.name, payload=e.payload, subject=state.subject))
                built.append((event, record, self.ctx.encode("EnvStep", record, rid)))
            state.next_event_index = start + len(built)  # taken only now, with nothing awaited since
            results = []
            try:
                for event, record, value in built:  # each delivered before the next
                    await self.ctx.deliver(self.ctx.env_topic, rid, "EnvStep", record, value)
                    self.ctx.metrics.env_events.labels(event.kind).inc()
                    results.append({"event_id": record["event_id"], "event_index": record["event_index"],
                                    "call_id": record["call_id"]})
            except GatewayError:
                if state.next_event_index == start + len(built):  # no later batch took indices meanwhile:
                    state.next_event_index = start  # the retry gets the same indices, so the same event ids
                raise
        except GatewayError as exc:
            return _error(exc)
        return JSONResponse({"events": results}, status_code=201)

    @staticmethod
    def _check_call_reference(state: AttemptState, event: EnvEvent) -> None:
        if event.call_id is not None and event.call_index is not None:
            raise bad_request("give call_id or call_index, not both", param="call_index")
        if event.call_index is not None and event.call_index >= state.next_call_index:
            raise bad_request(f"call_index {event.call_index} does not exist yet: the attempt has "
                              f"{state.next_call_index} calls", param="call_index")

    async def finish(self, request: Request) -> JSONResponse:
        rid, aid = request.path_params["rollout_id"], request.path_params["attempt_id"]
        try:
            state = self.ctx.registry.get_active(rid, aid, for_what="finish")
            self._require_attempt_key(request, state)
            body = validate(Finish, await self.ctx.body_checks.read_json(request, self.ctx.max_body_bytes,
                                                                          model=Finish, allow_empty=True))
            record = await self.publish_finish(state, body.status, body.final_artifacts)
        except GatewayError as exc:
            return _error(exc)
        return JSONResponse({"rollout_id": rid, "attempt_id": aid, "status": body.status,
                             "call_count": record["call_count"], "event_count": record["event_count"],
                             "event_id": record["event_id"]})

    async def publish_finish(self, state: AttemptState, status: str, final_artifacts: Any) -> dict[str, Any]:
        """Finish the attempt and put its AttemptFinished, with the counts, on Kafka (or the spool); an
        attempt whose finish cannot be stored stays open. Also how organic sessions end (sessions.py)."""
        # Calls still delivering their records count: they have their indices already.
        await state.wait_idle(self.ctx.finish_wait_s)
        await self.ctx.ready_to_seal("AttemptFinished", state.subject)
        rid, aid = state.rollout_id, state.attempt_id
        # Built and encoded before the attempt is marked finished (a record that cannot be stored
        # leaves it open); nothing is awaited between the counts read here and the finish.
        record = _built(lambda: records.attempt_finished(
            rollout_id=rid, attempt_id=aid, status=status, call_count=state.next_call_index,
            event_count=state.next_event_index, final_artifacts=final_artifacts, subject=state.subject))
        value = self.ctx.encode("AttemptFinished", record, rid)
        state = self.ctx.registry.finish(rid, aid, status)
        try:
            await self.ctx.deliver(self.ctx.env_topic, rid, "AttemptFinished", record, value)
        except GatewayError:
            self.ctx.registry.unfinish(state)
            raise
        return record
