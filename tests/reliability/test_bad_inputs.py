"""The bad-input corpus end to end: a real gateway (real SDK calls first), a real faust worker and the
real ClickHouse sink on private topics, and the configuration loaders. Every case must get its stated
answer, no process may crash, and nothing accepted before the bad inputs may be lost."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from reliability.bad_inputs.catalogue import corpus_size, http_cases
from reliability.bad_inputs.http_case import HttpCase, HttpExpect
from reliability.bad_inputs.security_cases import BODY_SECRET, SecurityCase, security_cases
from reliability.bad_inputs.topic_cases import topic_cases
from reliability.corpus import run_corpus
from reliability.results import table
from reliability.security_check import Keys, Pending, check_records
from tokentrail.settings import Settings

pytestmark = pytest.mark.e2e

# Cases whose right answer the gateway does not give yet (each must still answer below 500; the security
# ones with exactly their stated wrong status, and with the other rollout untouched).
KNOWN_GAPS: set[str] = set()


def test_the_corpus_is_large_and_every_case_states_an_expectation() -> None:
    assert corpus_size() >= 100
    areas = {c.area for c in http_cases("m")}
    assert areas == {"openai", "anthropic", "env"}
    for case in http_cases("m"):  # an error in the caller's protocol, or a harness's real shape now served
        assert case.what and (case.expect.status >= 400 or case.expect.status == 200), case.id
    assert sum(c.expect.status >= 400 for c in http_cases("m")) >= 100
    for case in topic_cases():
        assert (case.dead_letter is None) != (case.expect_incomplete is None), case.id
    security = security_cases("m")
    assert {c.klass for c in security} == {"request without a valid key", "another rollout's key",
                                           "management without admin key", "credentials in a recorded call",
                                           "body over the size limit"}
    for case in security:
        assert (case.request.expect.status == 200) == bool(case.redacted), case.id
        assert (case.gap is None) == (case.gap_status is None), case.id


def test_security_record_checks_catch_leaks_and_touched_rollouts() -> None:
    keys = Keys({"rollout_id": "live", "attempt_id": "a1", "api_key": "tt-live-key", "event_id": "s-live"},
                {"rollout_id": "victim", "attempt_id": "a1", "api_key": "tt-victim-key", "event_id": "s-victim"})
    request = HttpCase("c", "openai", "k", "w", "/p", HttpExpect(200, "openai"))
    redact = Pending(SecurityCase("redact", "k", "w", request, redacted=("headers.authorization", "body.api_key")),
                     "", None, call_id="call-1")
    untouched = Pending(SecurityCase("iso", "k", "w", request, untouched=True), "", None)
    stored = {"headers": {"authorization": "[redacted]"}, "body": {"api_key": BODY_SECRET}}
    call = {"event_id": "call-1", "rollout_id": "live", "request_json": orjson.dumps(stored).decode()}
    victim_call = {"event_id": "call-v", "rollout_id": "victim"}
    records = [(b"...", {"event_id": "s-victim", "rollout_id": "victim"}), (b"x" + BODY_SECRET.encode(), call),
               (b"...", victim_call)]
    check_records([redact, untouched], records, keys)
    assert any("credentials on Kafka" in p for p in redact.problems)
    assert any("body.api_key stored as" in p for p in redact.problems)
    assert untouched.problems == ["records of the other rollout on Kafka: ['s-victim', 'call-v']"]
    clean = Pending(redact.case, "", None, call_id="call-1")
    stored["body"]["api_key"] = "[redacted]"
    call["request_json"] = orjson.dumps(stored).decode()
    check_records([clean], [(b"...", call)], keys)
    assert clean.problems == []


def test_bad_inputs_get_their_stated_answers_and_nothing_accepted_is_lost(
        kafka_bootstrap: str, tokentrail_settings: Settings, tmp_path: Path) -> None:
    lines: list[str] = []
    summary = run_corpus(tokentrail_settings, tmp_path, lines.append)
    print("\n".join(lines))
    print(table(summary))
    failed = {c.id: c.detail for c in summary.failed_cases}
    assert not failed, failed
    assert len(summary.cases) >= 100
    assert {c.id for c in summary.open_gaps} == KNOWN_GAPS
    assert summary.health_ok, "gateway /health did not answer 200 after the corpus"
    assert summary.accepted_checked >= 8 and summary.accepted_lost == 0
    # Every class of input was exercised on every surface.
    assert {c.area for c in summary.cases} == {"openai", "anthropic", "env", "security", "topic", "sink", "config",
                                               "verifier"}
    assert summary.as_json()["security"] == len(security_cases("m")) == summary.as_json()["security_passed"]
