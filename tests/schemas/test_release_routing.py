"""The contract's release part: routing moved here unchanged, and the traffic fold the gateway uses agrees
with the controller's fold on the same decisions (stale and malformed ones included)."""

from __future__ import annotations

import json

from processors.release import routing as processors_routing
from processors.release.controller import ReleaseState, initial_state, manual_decision, pin_decision, start_decision
from processors.release.events import DecisionLog, Record, decision_record
from processors.release.plan import load_plan
from schemas.release_routing import route, session_point
from schemas.release_traffic import Traffic, TrafficLog

PLAN = load_plan({"ramp": [0.1, 0.5]})


def _history() -> list[Record]:
    """start 3 -> 4, pin eval -> 3, ramp, a stale duplicate, a malformed one, rollback, start 5, promote."""
    state: ReleaseState = initial_state("policy", PLAN, serving_version=3)
    records: list[Record] = []

    def take(make: object) -> None:
        nonlocal state
        record, state = decision_record(state, make(state), created_at_us=len(records))  # type: ignore[operator]
        records.append(record)

    take(lambda s: start_decision(s, 4, "ops", plan=PLAN))
    take(lambda s: pin_decision(s, "eval", 3, "ops"))
    take(lambda s: manual_decision(s, "ramp", "ops"))
    records.append(dict(records[-1], event_id="late-duplicate"))  # lost a race: stale
    broken = dict(records[-1], sequence=state.sequence, event_id="broken", pinned_json="not json")
    records.append(broken)  # malformed: set aside, the sequence stays free
    take(lambda s: manual_decision(s, "rollback", "ops"))
    take(lambda s: start_decision(s, 5, "ops", plan=PLAN))
    take(lambda s: manual_decision(s, "promote", "ops"))
    return records


def test_the_processors_name_is_the_same_function() -> None:
    assert processors_routing.route is route and processors_routing.session_point is session_point


def test_traffic_fold_agrees_with_the_decision_log_after_every_decision() -> None:
    records = _history()
    for end in range(1, len(records) + 1):
        full = DecisionLog.fold(records[:end]).states["policy"]
        traffic = TrafficLog.fold(records[:end]).tracks["policy"]
        assert (traffic.serving_version, traffic.candidate_version, traffic.candidate_fraction,
                dict(traffic.pinned), traffic.sequence) == (
            full.serving_version, full.candidate_version, full.candidate_fraction, dict(full.pinned), full.sequence)
        if full.candidate_version is not None:
            assert traffic.release_id == full.release_id
    log = TrafficLog.fold(records)
    assert log.stale == 1 and len(log.rejected) == 1 and "broken" in log.rejected[0]
    assert log.tracks["policy"].serving_version == 5 and log.tracks["policy"].candidate_version is None


def test_routing_by_the_folded_traffic_matches_route_and_pins_win() -> None:
    records = _history()[:3]  # candidate 4 at 50%, eval pinned to 3
    traffic = TrafficLog.fold(records).tracks["policy"]
    assert traffic.candidate_fraction == 0.5 and traffic.served_versions() == {3, 4}
    sessions = [f"rollout-{i}" for i in range(2000)]
    versions = [traffic.version_for(s) for s in sessions]
    assert versions == [route(s, release_id=traffic.release_id, serving_version=3, candidate_version=4,
                              candidate_fraction=0.5) for s in sessions]
    assert 0.45 < versions.count(4) / len(sessions) < 0.55
    assert all(traffic.version_for(s, label="eval") == 3 for s in sessions[:50])
    assert json.loads(json.dumps(traffic.as_dict()))["candidate_version"] == 4


def test_no_candidate_serves_everyone_the_serving_version() -> None:
    traffic = Traffic(model="policy", serving_version=9)
    assert {traffic.version_for(f"s{i}") for i in range(100)} == {9} and traffic.served_versions() == {9}
