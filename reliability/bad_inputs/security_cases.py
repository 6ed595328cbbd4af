"""Requests to a gateway that requires keys: what must be refused, left untouched and stored redacted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

# Short local names: each row of the tables below states its expected answer with one of them.
from reliability.bad_inputs.http_case import HttpCase, HttpExpect
from reliability.bad_inputs.http_case import anthropic_error as an
from reliability.bad_inputs.http_case import env_error as ev
from reliability.bad_inputs.http_case import openai_error as oa
from reliability.bad_inputs.limits import HUGE

Record = dict[str, Any]


# The security cases run on a second gateway that requires keys: ``require_auth`` and this admin key.
SECURITY_ADMIN_KEY = "corpus-admin-key-5f0c9d"
# Credentials sent along with accepted calls: they must reach Kafka only as "[redacted]".
HEADER_SECRET = "sk-header-secret-8c1e47"
BODY_SECRET = "sk-body-secret-2b96d3"


@dataclass(frozen=True)
class SecurityCase:
    """A request to a gateway that requires keys, judged like an HttpCase (``request.expect``), plus what
    must hold after it:

    ``untouched``: the other rollout's open attempt ({victim}) got no call, event, finish or retry;
    ``redacted``: the request is accepted (``request.expect.status`` is 200) and the stored request of its
    CallRecord, read back from Kafka, has "[redacted]" at these places (``headers.<name>`` or
    ``body.<field>``); no key or secret may appear anywhere in any record's bytes.
    ``chunked``: the body is streamed without a Content-Length (the limit must hold for what is read).
    ``gap`` / ``gap_status``: the gateway's answer today where it is not the right one; the case then
    passes only with exactly ``gap_status`` (never a success) and the checks above, and is reported as a gap.

    Placeholders: ``{live}`` / ``{victim}`` are ``<rollout>/attempts/<attempt>`` of two open attempts of
    different rollouts, ``{live_rollout}`` / ``{victim_rollout}`` their rollout ids, ``{live_key}`` the
    live attempt's own key (minted by ``POST /v1/rollouts``), ``{admin_key}`` the gateway's admin key.
    """

    id: str
    klass: str
    what: str
    request: HttpCase
    untouched: bool = False
    redacted: tuple[str, ...] = ()
    chunked: bool = False
    gap: str | None = None
    gap_status: int | None = None


def security_cases(model: str) -> list[SecurityCase]:
    chat, msgs = "/v1/chat/completions", "/v1/messages"
    user = [{"role": "user", "content": "hi"}]
    openai_req = {"model": model, "messages": user, "max_tokens": 2}
    anthropic_req = {"model": model, "messages": user, "max_tokens": 2}
    anthropic_version = {"anthropic-version": "2023-06-01"}
    bearer = {"authorization": "Bearer {live_key}"}
    permission_gap = "401 (authentication_error): a valid key used where it has no rights is not told apart " \
                     "from a wrong key"

    def c(id_: str, klass: str, what: str, area: Literal["openai", "anthropic", "env"], path: str,
          expect: HttpExpect, body: Any = None, *, method: str = "POST", headers: dict[str, str] | None = None,
          untouched: bool = False, redacted: tuple[str, ...] = (), chunked: bool = False,
          gap_status: int | None = None) -> SecurityCase:
        request = HttpCase(f"security.{id_}", area, klass, what, path, expect, body, None, method,
                           dict(headers or {}))
        return SecurityCase(request.id, klass, what, request, untouched, redacted, chunked,
                            permission_gap if gap_status else None, gap_status)

    # Management with a key that is not the admin key: 401 or 403 are both right; this gateway says 401.
    no_key, isolation, admin = "request without a valid key", "another rollout's key", "management without admin key"
    redaction, size = "credentials in a recorded call", "body over the size limit"
    unauth_oa = oa(401, "invalid_api_key", error_type="authentication_error")
    return [
        c("no_key.openai_path", no_key, "chat call on an attempt path without any key", "openai",
          f"/rollouts/{{live}}{chat}", unauth_oa, openai_req),
        c("no_key.anthropic_path", no_key, "messages call on an attempt path without any key", "anthropic",
          f"/rollouts/{{live}}{msgs}", an(401, "authentication_error"), anthropic_req, headers=anthropic_version),
        c("no_key.unattributed", no_key, "chat call with neither key nor rollout", "openai", chat, unauth_oa,
          openai_req),
        c("no_key.header_identity", no_key, "X-Rollout-Id of an open attempt but no key", "openai", chat, unauth_oa,
          openai_req, headers={"X-Rollout-Id": "{live_rollout}"}),
        c("no_key.wrong_bearer", no_key, "a key nobody issued, on an attempt path", "openai",
          f"/rollouts/{{live}}{chat}", unauth_oa, openai_req, headers={"authorization": "Bearer sk-not-a-key"}),
        c("no_key.forged_rollout_key", no_key, "a made-up key with the rollout-key prefix (x-api-key)", "anthropic",
          msgs, an(401, "authentication_error"), anthropic_req,
          headers={**anthropic_version, "x-api-key": "tt-forged-0000000000000000"}),
        c("no_key.events", no_key, "environment events without any key", "env", "/v1/rollouts/{live}/events",
          ev(401, "invalid_api_key", "authentication"), {"kind": "STEP"}),
        c("no_key.status", no_key, "attempt status without any key", "env", "/v1/rollouts/{live}",
          ev(401, "invalid_api_key", "authentication"), method="GET"),
        c("isolation.openai_path", isolation, "chat call on another rollout's attempt path", "openai",
          f"/rollouts/{{victim}}{chat}", oa(403, error_type="permission_error"), openai_req, headers=bearer,
          untouched=True, gap_status=401),
        c("isolation.anthropic_path", isolation, "messages call on another rollout's attempt path", "anthropic",
          f"/rollouts/{{victim}}{msgs}", an(403, "permission_error"), anthropic_req,
          headers={**anthropic_version, "x-api-key": "{live_key}"}, untouched=True, gap_status=401),
        c("isolation.header", isolation, "chat call naming another rollout in X-Rollout-Id", "openai", chat,
          oa(403, error_type="permission_error"), openai_req, headers={**bearer, "X-Rollout-Id": "{victim_rollout}"},
          untouched=True, gap_status=401),
        c("isolation.events", isolation, "events posted to another rollout's attempt", "env",
          "/v1/rollouts/{victim}/events", ev(403, error_type="permission"), {"kind": "STEP"}, headers=bearer,
          untouched=True, gap_status=401),
        c("isolation.finish", isolation, "finishing another rollout's attempt", "env", "/v1/rollouts/{victim}/finish",
          ev(403, error_type="permission"), {"status": "SUCCESS"}, headers=bearer, untouched=True, gap_status=401),
        c("isolation.status", isolation, "reading another rollout's attempt status", "env", "/v1/rollouts/{victim}",
          ev(403, error_type="permission"), method="GET", headers=bearer, untouched=True, gap_status=401),
        c("admin.start_no_key", admin, "start a rollout without any key", "env", "/v1/rollouts",
          ev(401, "invalid_api_key", "authentication"), {"task_input": {"answer": "4"}}),
        c("admin.start_wrong_key", admin, "start a rollout with a wrong admin key", "env", "/v1/rollouts",
          ev(401, "invalid_api_key", "authentication"), {"task_input": {"answer": "4"}},
          headers={"authorization": "Bearer not-the-admin-key"}),
        c("admin.start_rollout_key", admin, "start a rollout with a rollout's own key", "env", "/v1/rollouts",
          ev(401, "invalid_api_key", "authentication"), {"task_input": {"answer": "4"}}, headers=bearer),
        c("admin.retry_no_key", admin, "a retry attempt of another rollout without any key", "env",
          "/v1/rollouts/{victim_rollout}/attempts", ev(401, "invalid_api_key", "authentication"), {},
          untouched=True),
        c("admin.retry_rollout_key", admin, "a retry attempt of another rollout with a rollout key", "env",
          "/v1/rollouts/{victim_rollout}/attempts", ev(401, "invalid_api_key", "authentication"), {},
          headers=bearer, untouched=True),
        c("redact.openai", redaction, "Authorization, x-api-key and a body api_key on an accepted chat call",
          "openai", f"/rollouts/{{live}}{chat}", HttpExpect(200, "openai"),
          {**openai_req, "api_key": BODY_SECRET, "user": "corpus"},
          headers={**bearer, "x-api-key": HEADER_SECRET},
          redacted=("headers.authorization", "headers.x-api-key", "body.api_key")),
        c("redact.anthropic", redaction, "x-api-key (the rollout key) and a body api_key on accepted messages",
          "anthropic", msgs, HttpExpect(200, "anthropic"), {**anthropic_req, "api_key": BODY_SECRET},
          headers={**anthropic_version, "x-api-key": "{live_key}"},
          redacted=("headers.x-api-key", "body.api_key")),
        c("size.chunked_no_length", size, "a streamed body over the limit without Content-Length", "openai",
          f"/rollouts/{{live}}{chat}", oa(413, "request_too_large"),
          {**openai_req, "messages": [{"role": "user", "content": HUGE}]}, headers=bearer, chunked=True),
    ]
