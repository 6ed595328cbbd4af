"""``POST /v1/feedback``: outside signals about a response, call, session or rollout, as Feedback events.

The body names one target (``{"response_id": "chatcmpl-..."}``, ``call_id``, ``session_id`` or
``rollout_id``), the kind and its value; the Feedback event is built and encoded before anything else
happens, so bad feedback is a 4xx in the OpenAI error shape with nothing stored, and good feedback is
on Kafka (or the spool) before the 201. The gateway keeps no feedback state: the feedback join
(processors/feedback/) decides what each event is worth. Once ``gateway.admin_key`` is set, posting
feedback needs it, as starting rollouts does, or a tenant key (tenants.py).

A tenant's feedback names only its own targets, else 403 ``wrong_tenant`` (feedback drives rewards and release
decisions, so one tenant must not move another's): a rollout of its sessions' windows (the id carries its
tenant's keyed tag: checked the same on every gateway process and after a restart), a session of its own
namespace (``session_id`` is taken as the tenant's, ``tenant:<name>:<id>``), or a call
or response of its windows: a tenant's call is answered with response ids that carry its call ref
(``chatcmpl-<call id>.<tag>``, the tag keyed on its tenant: checked the same on every process and after a
restart); a bare call id only where it was served (remembered; elsewhere refused: give the response id or
name its rollout). Callers without a key (keys off) may not name a tenant's rollout, session or call.

A ``session_id`` target is published as its keyed ref (``SessionRefs.session_target``), the form calls record a
harness session id in (a user id may stand there); a ref read from the records is taken as it is.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from producers.gateway.body import validate
from producers.gateway.context import GatewayContext
from producers.gateway.errors import GatewayError, bad_request
from producers.gateway.identity import is_admin, presented_key
from producers.gateway.records import now_us, redact
from producers.gateway.session_refs import DEV_SESSION_REF_KEY, SessionRefs, is_stored_ref, is_tenant_window
from producers.gateway.tenants import Tenants
from schemas.feedback import FeedbackError, FeedbackValue, build_feedback, call_ref_of_response, split_call_ref
from schemas.topics import FEEDBACK_TOPIC

# Event times ahead of the gateway's clock by more than this are refused: they would move the join's
# watermark forward and close other rollouts' windows early.
MAX_CLOCK_SKEW_S = 300.0
TARGET_FIELDS = {"response_id": "RESPONSE", "call_id": "CALL", "session_id": "SESSION", "rollout_id": "ROLLOUT"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FeedbackTarget(_Strict):
    response_id: str | None = None
    call_id: str | None = None
    session_id: str | None = None
    rollout_id: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> FeedbackTarget:
        named = [name for name in TARGET_FIELDS if getattr(self, name) is not None]
        if len(named) != 1:
            raise ValueError(f"name exactly one of {', '.join(TARGET_FIELDS)} (got {len(named)})")
        return self

    def kind_and_id(self) -> tuple[str, str]:
        name = next(name for name in TARGET_FIELDS if getattr(self, name) is not None)
        return TARGET_FIELDS[name], getattr(self, name)


class FeedbackBody(_Strict):
    target: FeedbackTarget
    kind: Literal["BINARY", "RATING", "OUTCOME", "TASK_OUTCOME", "TEXT"]
    binary: bool | None = None
    rating: float | None = None
    rating_scale: tuple[float, float] = (0.0, 1.0)  # [min, max] of the rating
    outcome: Literal["ACCEPTED", "EDITED", "REJECTED"] | None = None
    edit_distance: float | None = None
    task_success: bool | None = None
    details: dict[str, Any] | None = None
    text: str | None = None
    source: str = Field(default="api", min_length=1, max_length=200)
    id: str | None = Field(default=None, min_length=1, max_length=200)  # the sender's own feedback id
    supersedes: str | None = None
    event_time: float | None = None  # unix seconds; default: when the gateway received it
    # Whose feedback text and details these are (issue 31); default: the session's key for a session
    # target, the rollout's subject for a rollout this gateway started. Sealed under that subject's key.
    subject: str | None = Field(default=None, min_length=1, max_length=200)

    @field_validator("kind", "outcome", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("binary", "task_success", mode="before")
    @classmethod
    def _strict_bool(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, bool):
            raise ValueError("must be true or false")
        return value


def _wrong_tenant(message: str) -> GatewayError:
    return GatewayError(403, message, "permission", code="wrong_tenant")


def _error(exc: GatewayError) -> JSONResponse:
    return JSONResponse(exc.openai_body(), status_code=exc.status)


def feedback_record(body: FeedbackBody, arrived_at_us: int) -> dict[str, Any]:
    """The Feedback event for a validated body; a FeedbackError or a bad event time is a 400."""
    if body.event_time is not None:
        if not math.isfinite(body.event_time) or body.event_time <= 0:
            raise bad_request("event_time must be a positive number of unix seconds", param="event_time")
        if body.event_time * 1e6 > arrived_at_us + MAX_CLOCK_SKEW_S * 1e6:
            raise bad_request(f"event_time is more than {MAX_CLOCK_SKEW_S:g} s ahead of the gateway's clock",
                              param="event_time")
    event_time_us = arrived_at_us if body.event_time is None else round(body.event_time * 1e6)
    target_kind, target_id = body.target.kind_and_id()
    value = FeedbackValue(binary=body.binary, rating=body.rating, rating_min=body.rating_scale[0],
                          rating_max=body.rating_scale[1], outcome=body.outcome, edit_distance=body.edit_distance,
                          task_success=body.task_success, text=body.text,
                          # Stored and joined into rewards: credentials in it go the way of a request's (by name).
                          details=None if body.details is None else redact(body.details))
    try:
        return build_feedback(source=body.source, target_kind=target_kind, target_id=target_id, kind=body.kind,
                              value=value, event_time_us=event_time_us, created_at_us=arrived_at_us,
                              source_feedback_id=body.id, supersedes=body.supersedes)
    except FeedbackError as exc:
        param = {"target": "target", "event_time": "event_time", "rating_min": "rating_scale"}.get(
            exc.param or "", exc.param)
        raise bad_request(str(exc), param=param, code="invalid_feedback") from exc


class FeedbackApi:
    def __init__(self, ctx: GatewayContext, refs: SessionRefs | None = None, topic: str = FEEDBACK_TOPIC) -> None:
        self.ctx, self.topic = ctx, topic
        self.refs = refs if refs is not None else SessionRefs(DEV_SESSION_REF_KEY)

    def routes(self) -> list[Route]:
        return [Route("/v1/feedback", self.post_feedback, methods=["POST"])]

    def _require_admin(self, request: Request) -> str | None:
        """None for the admin (or with keys off); a tenant's name for its key (its targets are checked)."""
        presented = presented_key(request.headers)
        tenant = self.ctx.tenants.of(presented) if self.ctx.tenants else None
        if tenant is not None:
            return tenant
        if self.ctx.admin_key and not is_admin(presented, self.ctx.admin_key):
            raise GatewayError(401, "posting feedback needs a tenant key or the gateway admin key",
                               "authentication", code="invalid_api_key")
        return None

    def _scope_session(self, body: FeedbackBody, tenant: str | None, admin: bool) -> None:
        """A tenant's session target is in its own namespace; a tenant's namespace is nobody else's."""
        session = body.target.session_id
        if session is None:
            return
        if tenant is not None:
            body.target.session_id = Tenants.scope(tenant, session)
        elif Tenants.tenant_of_session(session) is not None and not admin:
            raise _wrong_tenant("session ids beginning 'tenant:' are the tenants' own")

    def _check_target(self, tenant: str | None, admin: bool, record: dict[str, Any]) -> None:
        """A tenant names only its own rollouts and calls; a caller without a key names no tenant's."""
        kind, target = record["target_kind"], record["target_id"]
        if kind == "ROLLOUT":
            owner_ok = self.refs.owned_by(target, tenant) if tenant is not None else not is_tenant_window(target)
        elif kind in ("CALL", "RESPONSE"):
            # A tenant's call ref (in its response ids) says whose it is on any process; a bare call id only
            # where it was served (remembered), as before call refs.
            ref = target if kind == "CALL" else (call_ref_of_response(target) or target)
            remembered = self.ctx.tenants.owner_of_call(record["call_id"])
            if tenant is not None:
                owner_ok = remembered == tenant or self.refs.call_owned_by(ref, tenant)
            else:
                owner_ok = remembered is None and split_call_ref(ref)[1] is None
        else:
            return  # SESSION: scoped before the record was built (_scope_session)
        if not owner_ok and not admin:
            raise _wrong_tenant("a tenant key posts feedback only on its own sessions' rollouts, calls and "
                                "responses (a bare call id served by another gateway process: give the "
                                "response id, or name its rollout)"
                                if tenant is not None else "this target belongs to a tenant")

    def _subject(self, body: FeedbackBody, record: dict[str, Any], session: str | None) -> str | None:
        if body.subject is not None:  # a name, as POST /v1/rollouts takes it: stored as its pseudonym
            return self.ctx.subjects.stored(body.subject)
        if session is not None:  # an organic session's key is its subject (sessions.py); a ref names nobody
            return None if is_stored_ref(session) else self.ctx.subjects.stored(session)
        if record["target_kind"] == "ROLLOUT":
            try:
                return self.ctx.registry.start_info(record["target_id"]).get("subject")
            except GatewayError:  # a rollout this gateway does not know (another replica's, or long gone)
                return None
        return None

    async def post_feedback(self, request: Request) -> JSONResponse:
        try:
            tenant = self._require_admin(request)
            admin = tenant is None and is_admin(presented_key(request.headers), self.ctx.admin_key)
            body = validate(FeedbackBody, await self.ctx.body_checks.read_json(request, self.ctx.max_body_bytes,
                                                                                model=FeedbackBody))
            if self.ctx.tenants:  # tenants configured: each target is checked for whose it is
                self._scope_session(body, tenant, admin)
            session = body.target.session_id
            if session is not None:  # matched against calls' session_id, which is its keyed ref (session_refs.py)
                body.target.session_id = self.refs.session_target(session)
            record = feedback_record(body, now_us())
            record["subject"] = self._subject(body, record, session)
            if self.ctx.tenants:
                self._check_target(tenant, admin, record)
            key = record["target_id"]
            value = await self.ctx.encode_ready("Feedback", record, key)  # refused here if it cannot be stored
            await self.ctx.deliver(self.topic, key, "Feedback", record, value)
        except GatewayError as exc:
            return _error(exc)
        return JSONResponse({"event_id": record["event_id"], "target_kind": record["target_kind"],
                             "target_id": record["target_id"], "call_id": record["call_id"],
                             "kind": record["kind"], "event_time_us": record["event_time_us"]}, status_code=201)
