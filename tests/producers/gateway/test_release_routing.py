"""The gateway follows the release decisions (real broker, real gateway on the embedded engine, real openai
SDK): a started candidate serves the rollouts its hash picks, records carry the version that produced their
tokens and the release arm they were routed on (checked against the decision log), a rollout keeps its version
while the fraction ramps, and a rollback sends every rollout back within seconds."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import torch
from transformers import AutoModelForCausalLM

from models.policy_store import PolicyStore
from processors.release.controller import (
    ReleaseState,
    initial_state,
    manual_decision,
    pin_decision,
    start_decision,
)
from processors.release.events import decision_record
from processors.release.plan import load_plan
from processors.stream.release_controller import publish_decision
from producers.delivery import CallPublisher
from producers.gateway.release_routed import assignment
from producers.gateway.session_refs import DEV_SESSION_REF_KEY, SessionRefs
from producers.gateway.text_side import ModelTextSide
from producers.gateway.wiring import build_app
from producers.sdk import Rollout
from schemas.kafka.config import producer_config
from schemas.release_routing import route
from schemas.release_traffic import TrafficLog
from testkit.gateway import running_gateway
from tokentrail.settings import Settings

from .helpers import read_records

SESSIONS = [f"release-session-{i:02d}" for i in range(16)]
HARNESS_SESSIONS = [f"harness-{i}" for i in range(3)]
EVAL_SESSION, EVAL_LABEL = "eval-suite", "eval"  # evaluation traffic pinned to the candidate by its label
PLAN = load_plan({"ramp": [0.3, 0.7]})


def _store(root: Path, model_dir: Path) -> PolicyStore:
    """Version 0: the reference weights; version 1: its output head perturbed (a different policy)."""
    store = PolicyStore(root)
    state = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).state_dict()
    store.publish(0, state)
    head = state["lm_head.weight"]
    state["lm_head.weight"] = head + torch.randn(head.shape, generator=torch.Generator().manual_seed(1)) * 0.5
    store.publish(1, state)
    return store


def _wait_for(gateway_url: str, ok: Callable[[dict[str, Any]], bool], timeout_s: float = 30.0) -> float:
    """Seconds until /health's release section satisfies ``ok``."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        release = httpx.get(f"{gateway_url}/health", timeout=10).json()["release"]
        if ok(release):
            return time.monotonic() - began
        time.sleep(0.1)
    raise AssertionError(f"the gateway did not follow the decision within {timeout_s} s: {release}")


def test_sessions_follow_start_ramp_and_rollback(tokentrail_settings: Settings, kafka_bootstrap: str,
                                                 new_topic: Callable[..., str], topics: dict[str, str],
                                                 model_dir: Path, text_side: ModelTextSide, tmp_path: Path) -> None:
    decisions = new_topic(partitions=1)
    store = _store(tmp_path / "policies", model_dir)
    gateway_settings = tokentrail_settings.gateway.model_copy(update={"follow_releases": True,
                                                                       "spool_dir": tmp_path / "spool"})
    settings = tokentrail_settings.model_copy(update={"gateway": gateway_settings})
    model = settings.model.name
    state: ReleaseState = initial_state(model, PLAN, serving_version=0)

    published: list[dict[str, Any]] = []

    def decide(make: Callable[[ReleaseState], Any]) -> None:
        nonlocal state
        record, state = decision_record(state, make(state), created_at_us=time.time_ns() // 1000)
        publish_decision(settings.kafka, decisions, record)
        published.append(record)

    decide(lambda s: start_decision(s, 1, "test", plan=PLAN))  # candidate 1 on 30% before the gateway starts
    publisher = CallPublisher(producer_config(settings.kafka), tmp_path / "spool", 5.0)
    app = build_app(settings, publisher=publisher, text=text_side, topics=topics, progress=lambda _: None,
                    policy_dir=store.root, release_topic=decisions)

    def expected(fraction: float) -> dict[str, int]:
        return {s: route(s, release_id=state.release_id, serving_version=0, candidate_version=1,
                         candidate_fraction=fraction) for s in SESSIONS}

    at_start, at_ramp = expected(0.3), expected(0.7)
    early = {s for s, v in at_start.items() if v == 1}
    moved = {s for s, v in at_ramp.items() if v == 1} - early
    assert early and moved and len(early | moved) < len(SESSIONS)  # every kind of session is in the test

    with running_gateway(app) as gw, contextlib.ExitStack() as stack:
        # The follower reads the decisions topic in the background: /health answers at once, calls wait for it.
        deadline = time.monotonic() + 60
        health = httpx.get(f"{gw.url}/health", timeout=10).json()["release"]
        while not health["caught_up"] and time.monotonic() < deadline:
            time.sleep(0.2)
            health = httpx.get(f"{gw.url}/health", timeout=10).json()["release"]
        assert health["caught_up"] and health["traffic"]["candidate_version"] == 1
        assert health["traffic"]["candidate_fraction"] == 0.3
        rollouts = {s: stack.enter_context(Rollout(gw.url, task_input={}, rollout_id=s)) for s in SESSIONS}
        clients = {s: r.openai_client(max_retries=0) for s, r in rollouts.items()}

        def call_all(turn: int) -> None:
            for s in SESSIONS:
                clients[s].chat.completions.create(model=model, max_tokens=2, seed=turn,
                                                   messages=[{"role": "user", "content": f"turn {turn}"}])

        call_all(0)
        _wait_for(gw.url, lambda r: {0, 1} <= set(r.get("resident_versions", [])))  # both kept in memory
        decide(lambda s: manual_decision(s, "ramp", "test"))
        _wait_for(gw.url, lambda r: r["traffic"]["candidate_fraction"] == 0.7)
        call_all(1)
        for harness_session in HARNESS_SESSIONS:  # no rollout named: routed by the harness's session id
            for turn in range(2):
                httpx.post(f"{gw.url}/v1/chat/completions", headers={"x-session-id": harness_session}, timeout=60,
                           json={"model": model, "max_tokens": 2, "seed": turn,
                                 "messages": [{"role": "user", "content": f"turn {turn}"}]}).raise_for_status()
        decide(lambda s: pin_decision(s, EVAL_LABEL, 1, "test"))
        _wait_for(gw.url, lambda r: r["traffic"]["pinned"] == {EVAL_LABEL: 1})
        for turn in range(2):  # the label's pin wins over the session's hash, whichever arm that gives
            httpx.post(f"{gw.url}/v1/chat/completions", timeout=60,
                       headers={"x-session-id": EVAL_SESSION, "x-tokentrail-traffic-label": EVAL_LABEL},
                       json={"model": model, "max_tokens": 2, "seed": turn,
                             "messages": [{"role": "user", "content": f"eval {turn}"}]}).raise_for_status()
        decide(lambda s: manual_decision(s, "rollback", "test"))
        rollback_seen_s = _wait_for(gw.url, lambda r: r["traffic"]["candidate_version"] is None)
        call_all(2)

    print(f"rollback followed by the gateway {rollback_seen_s:.2f} s after it was published")
    assert rollback_seen_s < 5.0  # docs/release.md: one poll (0.2 s) when idle, under 5 s on a loaded machine
    records = [r for _name, r in read_records(settings, topics["calls_topic"],
                                              3 * len(SESSIONS) + 2 * len(HARNESS_SESSIONS) + 2)]
    stored = SessionRefs(DEV_SESSION_REF_KEY).ref  # calls record a harness session id as its keyed ref
    evaluation = [r for r in records if r["session_id"] == stored(EVAL_SESSION)]
    assert [(r["versions"]["policy_version"], r["release"]["arm"], r["release"]["pin_label"]) for r in evaluation] \
        == [(1, "pinned", EVAL_LABEL)] * 2
    by_harness: dict[str, list[int]] = {}
    for r in records:
        if r["rollout_id"] == "unattributed" and r["session_id"] != stored(EVAL_SESSION):
            by_harness.setdefault(r["session_id"], []).append(r["versions"]["policy_version"])
    assert by_harness == {stored(h): [route(f"session:{stored(h)}", release_id=state.release_id, serving_version=0,
                                    candidate_version=1, candidate_fraction=0.7)] * 2 for h in HARNESS_SESSIONS}
    # Each record's release arm is what the decision log says for its session at the decision it names.
    traffic_at = [TrafficLog.fold(published[: i + 1]).tracks[model] for i in range(len(published))]
    for r in records:
        key = r["rollout_id"] if r["rollout_id"] != "unattributed" else f"session:{r['session_id']}"
        release = r["release"]
        label = EVAL_LABEL if r["session_id"] == stored(EVAL_SESSION) else None
        version, expected_release = assignment(traffic_at[release["decision_sequence"]], key, label)
        assert release == expected_release.as_record() and r["versions"]["policy_version"] == version
    assert {(r["call_index"], r["release"]["decision_sequence"]) for r in records
            if r["rollout_id"] != "unattributed"} == {(0, 0), (1, 1), (2, 3)}  # 2: the pin
    assert {r["release"]["arm"] for r in records
            if r["call_index"] == 1 and r["session_id"] != stored(EVAL_SESSION)} == {"serving", "candidate"}
    records = [r for r in records if r["rollout_id"] != "unattributed"]
    served = {(r["rollout_id"], r["call_index"]): r["versions"]["policy_version"] for r in records}
    assert all(r["error"] is None for r in records)
    assert {s: served[(s, 0)] for s in SESSIONS} == at_start  # the hash decides; the record says so
    assert {s: served[(s, 1)] for s in SESSIONS} == at_ramp  # early ones stayed, the next 40% moved
    assert all(served[(s, 1)] == 1 for s in early)
    assert {served[(s, 2)] for s in SESSIONS} == {0}  # the rollback sent everyone back
