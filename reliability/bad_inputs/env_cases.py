"""Environment API requests (events, finishes, retries) the gateway must refuse in the env error shape."""

from __future__ import annotations

from typing import Any

# Short local names: each row of the tables below states its expected answer with one of them.
from reliability.bad_inputs.http_case import HttpCase, HttpExpect
from reliability.bad_inputs.http_case import env_error as ev
from reliability.bad_inputs.limits import HUGE


def env_cases() -> list[HttpCase]:
    def c(id_: str, klass: str, what: str, path: str, expect: HttpExpect, body: Any = None, *,
          raw: bytes | None = None, method: str = "POST") -> HttpCase:
        return HttpCase(f"env.{id_}", "env", klass, what, path, expect, body, raw, method)

    live, done, base = "/v1/rollouts/{live}", "/v1/rollouts/{done}", "/v1/rollouts"
    return [
        c("events.unknown_rollout", "unknown rollout id", "events for a rollout nobody started",
          f"{base}/never-started/attempts/a0/events", ev(404, "unknown_rollout"), {"kind": "STEP"}),
        c("finish.before_start", "finish before start", "finish of a rollout nobody started",
          f"{base}/never-started/attempts/a0/finish", ev(404, "unknown_rollout"), {}),
        c("status.unknown_rollout", "unknown rollout id", "status of a rollout nobody started",
          f"{base}/never-started/attempts/a0", ev(404, "unknown_rollout"), method="GET"),
        c("retry.unknown_rollout", "unknown rollout id", "a retry attempt of a rollout nobody started",
          f"{base}/never-started/attempts", ev(404, "unknown_rollout"), {}),
        c("events.unknown_attempt", "unknown rollout id", "events for an attempt id the rollout never had",
          "/v1/rollouts/{live_rollout}/attempts/not-an-attempt/events", ev(404), {"kind": "STEP"}),
        c("start.group_size_zero", "wrong type", "expected_group_size 0", base, ev(400, error_type="invalid_request"),
          {"expected_group_size": 0}),
        c("start.unknown_field", "wrong type", "an unknown field", base, ev(400, error_type="invalid_request"),
          {"surprise": 1}),
        c("start.bad_rollout_id", "wrong type", "rollout_id with spaces and slashes", base,
          ev(400, error_type="invalid_request"), {"rollout_id": "a b/c"}),
        c("start.empty_rollout_id", "wrong type", "rollout_id ''", base, ev(400, error_type="invalid_request"),
          {"rollout_id": ""}),
        c("start.group_key_nested", "wrong type", "group_key values must be strings", base,
          ev(400, error_type="invalid_request"), {"group_key": {"task": {"nested": 1}}}),
        c("start.not_json", "malformed JSON", "plain text body", base, ev(400, "invalid_json"), raw=b"start please"),
        c("start.array", "malformed JSON", "top-level array", base, ev(400, "invalid_json"), [1]),
        c("start.non_utf8", "non-UTF-8", "a 0xff byte", base, ev(400, "invalid_encoding"), raw=b'{"x": "\xff"}'),
        c("start.huge", "oversized payload", "task_input over the body limit", base,
          ev(413, "request_too_large"), {"task_input": HUGE}),
        c("start.in_progress", "duplicate start", "restart a rollout whose attempt is still open", base,
          ev(409, "attempt_in_progress"), {"rollout_id": "{live_rollout}"}),
        c("retry.in_progress", "duplicate start", "a retry while the attempt is still open",
          "/v1/rollouts/{live_rollout}/attempts", ev(409, "attempt_in_progress"), {}),
        c("events.bad_kind", "bad event kind", "kind 'BOGUS'", f"{live}/events",
          ev(400, error_type="invalid_request"), {"kind": "BOGUS"}),
        c("events.no_kind", "bad event kind", "event without kind", f"{live}/events",
          ev(400, error_type="invalid_request"), {"payload": 1}),
        c("events.kind_number", "bad event kind", "kind 5", f"{live}/events", ev(400, error_type="invalid_request"),
          {"kind": 5}),
        c("events.empty_batch", "bad event kind", "events = []", f"{live}/events",
          ev(400, error_type="invalid_request"), {"events": []}),
        c("events.too_many", "oversized payload", "1001 events in one request", f"{live}/events",
          ev(400, error_type="invalid_request"), {"events": [{"kind": "STEP"}] * 1001}),
        c("events.future_call", "bad event kind", "call_index of a call that does not exist yet",
          f"{live}/events", ev(400, contains="does not exist yet"), {"kind": "TOOL_RESULT", "call_index": 10**6}),
        c("events.both_refs", "bad event kind", "call_id and call_index together", f"{live}/events",
          ev(400, contains="not both"), {"kind": "STEP", "call_id": "c", "call_index": 0}),
        c("events.negative_index", "bad event kind", "call_index -1", f"{live}/events",
          ev(400, error_type="invalid_request"), {"kind": "STEP", "call_index": -1}),
        c("events.unknown_field", "bad event kind", "an unknown field on an event", f"{live}/events",
          ev(400, error_type="invalid_request"), {"kind": "STEP", "colour": "red"}),
        c("events.oversized_payload", "oversized payload", "payload over the body limit", f"{live}/events",
          ev(413, "request_too_large"), {"kind": "OBSERVATION", "payload": HUGE}),
        c("events.non_utf8", "non-UTF-8", "latin-1 encoded event", f"{live}/events", ev(400, "invalid_encoding"),
          raw='{"kind": "STEP", "payload": "d\u00e9j\u00e0"}'.encode("latin-1")),
        c("events.after_finish", "events after finish", "an event on a finished attempt", f"{done}/events",
          ev(409, "attempt_finished"), {"kind": "STEP"}),
        c("finish.duplicate", "duplicate finish", "finishing an attempt twice", f"{done}/finish",
          ev(409, "attempt_finished"), {}),
        c("finish.bad_status", "wrong type", "status 'MAYBE'", f"{live}/finish",
          ev(400, error_type="invalid_request"), {"status": "MAYBE"}),
        c("finish.unknown_field", "wrong type", "an unknown field on finish", f"{live}/finish",
          ev(400, error_type="invalid_request"), {"status": "SUCCESS", "score": 1}),
        c("finish.not_json", "malformed JSON", "plain text finish body", f"{live}/finish",
          ev(400, "invalid_json"), raw=b"done!"),
        c("finish.huge_artifacts", "oversized payload", "final artifacts over the body limit", f"{live}/finish",
          ev(413, "request_too_large"), {"final_artifacts": {"log": HUGE}}),
    ]
