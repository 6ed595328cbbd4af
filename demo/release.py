"""``tokentrail demo --release``: safe policy release on live traffic, end to end on this machine.

Runs in a state directory of its own (``var/release-demo/<time>``, or ``--state-dir``) with a Kafka broker
of its own on free ports, so it never touches another broker, topic or table; it stops only that broker.

1. Three policy versions (``demo.release_policies``): serving v1, a good candidate v2 trained
   further on the task reward, a bad candidate v3 trained on the flipped reward.
2. The gateway (following the release decisions), the stream processors and the release controller
   (``tokentrail release control``) run as services; agent rollouts of the lookup task run through the
   ``openai`` SDK the whole time.
3. ``tokentrail release start --serving 1 --candidate 2``: the controller ramps v2 and promotes it.
4. ``tokentrail release start --candidate 3``: the controller rolls v3 back by its sequential test.
5. ClickHouse catch-up, the audit, and the figures read back from the topics: the share of sessions the
   bad candidate served while it was out, and how long the rollback took. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from demo.agent import RolloutOutcome, run_rollout
from demo.environment import make_task
from demo.release_policies import prepare_versions
from demo.services import Service, http_ok, wait_until
from demo.steps import private_env, run_cli, step
from models.policy_store import PolicyStore
from processors.release.controller import ReleaseState
from processors.release.events import DecisionLog, Record
from processors.stream.release_controller import ReleaseTopicError, read_decisions
from schemas import topics
from schemas.codec import DecodeError
from schemas.kafka.config import KafkaSettings, consumer_config
from schemas.kafka.registry_framing import kafka_codec
from tokentrail.errors import CliError
from tokentrail.forgetting import reinstall, uninstall
from tokentrail.settings import REPO_ROOT, Settings, get_settings

DEMO_PLAN = REPO_ROOT / "deploy" / "config" / "release-demo.yaml"
TOTAL_STEPS = 8


def _step(n: int, text: str) -> None:
    step(n, TOTAL_STEPS, text)


# ---- the workload ----------------------------------------------------------------------------------


class Sessions:
    """Keeps ``concurrency`` groups of lookup-task rollouts (agent sessions) in flight until told to stop."""

    def __init__(self, gateway_url: str, model: str, group_size: int, concurrency: int, seed: int) -> None:
        self.gateway_url, self.model, self.group_size, self.concurrency = gateway_url, model, group_size, concurrency
        self.next_seed = seed
        self.outcomes: list[RolloutOutcome] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=concurrency * group_size, thread_name_prefix="session")
        self._thread = threading.Thread(target=self._run, name="sessions", daemon=True)

    def start(self) -> None:
        if not self._thread.is_alive() and not self._stop.is_set():
            self._thread.start()

    def stop(self) -> None:
        """Start no new group; wait for the sessions in flight to finish."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._pool.shutdown()

    def _group(self) -> list[Future[RolloutOutcome]]:
        task = make_task(self.next_seed)
        self.next_seed += 1
        return [self._pool.submit(run_rollout, self.gateway_url, self.model, task, f"{task.task_id}-g",
                                  self.group_size) for _ in range(self.group_size)]

    def _run(self) -> None:
        in_flight: set[Future[RolloutOutcome]] = set()
        while not self._stop.is_set() or in_flight:
            while not self._stop.is_set() and len(in_flight) < self.concurrency * self.group_size:
                in_flight.update(self._group())
            done, in_flight = wait(in_flight, timeout=0.5, return_when=FIRST_COMPLETED)
            for future in done:
                try:
                    self.outcomes.append(future.result())
                except Exception as exc:  # a failed session is reported; the run goes on
                    self.errors.append(repr(exc))


# ---- reading the topics back -----------------------------------------------------------------------


def release_track(kafka: KafkaSettings, model: str) -> tuple[ReleaseState | None, list[Record]]:
    """The track's folded state and its applied decisions, read from the decisions topic to its end."""
    try:
        log = DecisionLog.fold(read_decisions(kafka, topics.RELEASE_DECISIONS_TOPIC, 30.0).records)
    except ReleaseTopicError as exc:  # printed by the command line, as before the reader moved out of the shell
        raise CliError(str(exc)) from None
    return log.states.get(model), [r for r in log.applied if r["model"] == model]


def read_topic(kafka: KafkaSettings, topic: str, expect: str, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Every record of ``topic`` up to its current end (a throwaway consumer, nothing committed)."""
    consumer = Consumer(consumer_config(kafka, f"release-demo-read-{uuid.uuid4().hex[:12]}"))
    codec = kafka_codec(kafka.schema_registry_url)
    try:
        parts = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts}
        waiting = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while waiting and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error() or msg.offset() >= ends[msg.partition()]:
                    continue
                try:
                    out.append(codec.decode(msg.value(), expect=expect)[1])
                except DecodeError:
                    pass
                if msg.offset() + 1 >= ends[msg.partition()]:
                    waiting.discard(msg.partition())
        return out
    finally:
        consumer.close()


@dataclass
class SessionView:
    first_call_us: int
    versions: set[int] = field(default_factory=set)


def sessions_by_rollout(calls: list[dict[str, Any]]) -> dict[str, SessionView]:
    sessions: dict[str, SessionView] = {}
    for call in calls:
        if call["rollout_id"] == "unattributed":
            continue
        at = int(call["timings"]["received_at_us"])
        view = sessions.setdefault(call["rollout_id"], SessionView(at))
        view.first_call_us = min(view.first_call_us, at)
        view.versions.add(int(call["versions"]["policy_version"]))
    return sessions


def exposure(sessions: dict[str, SessionView], version: int, since_us: int, until_us: int) -> tuple[int, int]:
    """(sessions that began in [since, until] and that ``version`` served, sessions that began then)."""
    window = [s for s in sessions.values() if since_us <= s.first_call_us <= until_us]
    return sum(version in s.versions for s in window), len(window)


def reward_by_version(sessions: dict[str, SessionView], rewards: list[dict[str, Any]]) -> dict[int, list[float]]:
    """Raw rewards of single-version sessions, by version (what the controller compares)."""
    out: dict[int, list[float]] = defaultdict(list)
    seen: set[str] = set()
    for reward in rewards:
        view = sessions.get(reward["rollout_id"])
        if view is None or len(view.versions) != 1 or reward["event_id"] in seen:
            continue
        seen.add(reward["event_id"])
        out[next(iter(view.versions))].append(float(reward["raw_reward"]))
    return dict(sorted(out.items()))


# ---- the run ---------------------------------------------------------------------------------------


@dataclass
class Phase:
    """One release from its start until the controller ends it (promote or rollback) or time runs out."""

    candidate: int
    start_us: int = 0
    end: Record | None = None

    @property
    def outcome(self) -> str:
        return self.end["action"] if self.end is not None else "undecided"


def _run_release(settings: Settings, phase: Phase, serving: int | None, plan: Path, timeout_s: float,
                 sessions: Sessions, began: float) -> None:
    """Start the release, wait until the gateway follows it (so no session runs on an older plan; the
    sessions start then, the first time), and watch the decisions until one ends the release."""
    model = settings.model.name
    run_cli("release", "start", "--candidate", str(phase.candidate), "--plan", str(plan), "--operator", "demo",
         "--reason", "tokentrail demo --release", *(["--serving", str(serving)] if serving is not None else []),
         quiet=True)
    gateway_url = f"http://{settings.gateway.host}:{settings.gateway.port}"
    wait_until(_gateway_follows(gateway_url, phase.candidate), 60, "the gateway to follow the release")
    sessions.start()
    _, applied = release_track(settings.kafka, model)
    phase.start_us = applied[-1]["created_at_us"]
    seen = len(applied)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(3.0)
        state, applied = release_track(settings.kafka, model)
        for record in applied[seen:]:
            print(f"  {time.monotonic() - began:5.0f}s  decision {record['sequence']}: {record['action']} by "
                  f"{record['source']} ({record['rule']}): {record['reason']}", flush=True)
        seen = len(applied)
        if state is not None and state.candidate_version is None:
            phase.end = applied[-1]
            return
        if state is not None:
            print(f"  {time.monotonic() - began:5.0f}s  candidate v{phase.candidate} at "
                  f"{state.candidate_fraction:.0%}; sessions done {len(sessions.outcomes)} "
                  f"({len(sessions.errors)} failed)", flush=True)
    print(f"  no decision ended the release of v{phase.candidate} within {timeout_s:.0f} s", flush=True)


def _gateway_follows(gateway_url: str, candidate: int) -> Callable[[], bool]:
    def check() -> bool:
        try:
            release = httpx.get(f"{gateway_url}/health", timeout=5.0).json()["release"]
        except (httpx.HTTPError, ValueError, KeyError):
            return False
        return bool(release.get("caught_up")) and release.get("traffic", {}).get("candidate_version") == candidate

    return check


def _drain(settings: Settings, quiet_s: float, budget_s: float) -> None:
    """Wait until the rewards topic has not grown for ``quiet_s`` (the processors closed the last groups)."""
    consumer = Consumer(consumer_config(settings.kafka, f"release-demo-drain-{uuid.uuid4().hex[:12]}"))
    try:
        def count() -> int:
            meta = consumer.list_topics(topics.REWARDS_TOPIC, timeout=10).topics[topics.REWARDS_TOPIC]
            return sum(consumer.get_watermark_offsets(TopicPartition(topics.REWARDS_TOPIC, p), timeout=10)[1]
                       for p in meta.partitions)

        deadline, last, quiet_since = time.monotonic() + budget_s, -1, time.monotonic()
        while time.monotonic() < deadline:
            now = count()
            if now != last:
                last, quiet_since = now, time.monotonic()
            elif time.monotonic() - quiet_since >= quiet_s:
                return
            time.sleep(1.0)
    finally:
        consumer.close()


def run_release_demo(args: argparse.Namespace) -> int:
    shared = get_settings()
    state_dir = (args.state_dir or shared.var_dir / "release-demo" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    os.environ.update(private_env(state_dir, shared.model.dir, {"TOKENTRAIL_GATEWAY__FOLLOW_RELEASES": "true"}))
    settings = Settings()  # the private settings, for this process's own clients
    # This process seals and opens subjects' content with the keys on its own broker, not the shared one.
    reinstall(settings)
    plan = (args.plan or DEMO_PLAN).resolve()
    logs = state_dir / "logs"
    print(f"release demo in {state_dir} (its own Kafka broker on {settings.kafka.bootstrap_servers})", flush=True)
    services: list[Service] = []
    sessions: Sessions | None = None
    fleet = contextlib.ExitStack()  # --upstream vllm: a vLLM server per version (demo/release_vllm.py)
    vllm = getattr(args, "upstream", "embedded") == "vllm"
    began = time.monotonic()
    try:
        _step(1, "Kafka broker of this run, topics, ClickHouse tables, reference model")
        run_cli("kafka", "start")
        run_cli("topics", "ensure", quiet=True)
        run_cli("clickhouse", "migrate", quiet=True)
        run_cli("model", "build", quiet=True)
        _step(2, "policy versions: serving v1, good candidate v2 (task reward), bad candidate v3 (flipped reward)")
        versions = prepare_versions(settings.model.dir, PolicyStore(state_dir / "policies"),
                                    lambda line: print(line, flush=True))
        _step(3, f"services: gateway (following release decisions), processors, release controller (logs in {logs})")
        if vllm:
            from demo.release_vllm import vllm_fleet

            os.environ.update(fleet.enter_context(vllm_fleet(settings.model.dir, settings.model.name, logs)))
        services = [
            Service("gateway", ["gateway"], logs / "gateway.log"),
            Service("processors", ["process", "--stall-timeout", "60"], logs / "processors.log"),
            Service("controller", ["release", "control", "--progress-every", "15"], logs / "controller.log"),
        ]
        for service in services:
            service.start()
        gateway_url = f"http://{settings.gateway.host}:{settings.gateway.port}"
        wait_until(http_ok(f"{gateway_url}/health"), 300, "the gateway", services[0])
        sessions = Sessions(gateway_url, settings.model.name, args.group_size, args.concurrency, args.seed)
        good, bad = Phase(versions.good), Phase(versions.bad)

        _step(4, f"release v{versions.good} beside v{versions.serving} (plan {plan.name}); sessions start")
        _run_release(settings, good, versions.serving, plan, args.phase_timeout_s, sessions, began)
        _step(5, f"release v{versions.bad} (trained on the flipped reward) beside v{versions.good}")
        _run_release(settings, bad, None, plan, args.phase_timeout_s, sessions, began)
        print(f"  stopping sessions ({len(sessions.outcomes)} done, {len(sessions.errors)} failed"
              + (f"; first: {sessions.errors[0]}" if sessions.errors else "") + ")", flush=True)
        sessions.stop()
        _step(6, "draining: the processors close the last groups")
        _drain(settings, quiet_s=10.0, budget_s=args.drain_s)
        for service in reversed(services):
            service.stop()
        calls = read_topic(settings.kafka, topics.CALLS_TOPIC, "CallRecord")
        rewards = read_topic(settings.kafka, topics.REWARDS_TOPIC, "Reward")
        _step(7, "ClickHouse catch-up, then the audit checks")
        run_cli("sink", "--once", quiet=True)
        audit = subprocess.run([sys.executable, "-m", "tokentrail.cli", "audit"], cwd=REPO_ROOT)
        _step(8, "report")
        report_path = state_dir / "report.html"
        run_cli("report", "--out", str(report_path), quiet=True)
    finally:
        if sessions is not None:
            sessions.stop()
        for service in reversed(services):
            service.stop()
        fleet.close()
        uninstall()  # nothing of this process may keep asking the run's broker once it stops
        if not args.keep_broker:  # this run's own broker (its own data dir and port), never another
            run_cli("kafka", "stop", quiet=True)
    extra: dict[str, Any] = {}
    if vllm:
        from demo.release_vllm import evidence

        extra = {"upstream": "vllm", **evidence(calls)}
    return _summarize(versions.probes, good, bad, sessions, calls, rewards, audit.returncode == 0, report_path,
                      time.monotonic() - began, extra)


def _summarize(probes: dict[int, float], good: Phase, bad: Phase, sessions: Sessions, calls: list[dict[str, Any]],
               rewards: list[dict[str, Any]], audit_passed: bool, report_path: Path, elapsed_s: float,
               extra: dict[str, Any] | None = None) -> int:
    by_rollout = sessions_by_rollout(calls)
    by_version = reward_by_version(by_rollout, rewards)
    print("\nreward (fraction answered right) by policy version, single-version sessions:")
    for version, values in by_version.items():
        print(f"  v{version}: {sum(values) / len(values):.3f}  ({len(values)} sessions)")
    bad_end_us = bad.end["created_at_us"] if bad.end is not None else int(time.time() * 1e6)
    served, window = exposure(by_rollout, bad.candidate, bad.start_us, bad_end_us)
    fraction = served / window if window else 0.0
    rollback_after_s = (bad.end["created_at_us"] - bad.start_us) / 1e6 if bad.outcome == "rollback" else None
    promote_after_s = (good.end["created_at_us"] - good.start_us) / 1e6 if good.outcome == "promote" else None
    print(f"\ngood candidate v{good.candidate}: {good.outcome}"
          + (f" after {promote_after_s:.0f} s ({good.end['rule']})" if good.end is not None else ""))
    print(f"bad candidate v{bad.candidate}: {bad.outcome}"
          + (f" after {rollback_after_s:.0f} s ({bad.end['rule']})" if rollback_after_s is not None else "")
          + f"; it served {served} of the {window} sessions begun while it was out ({fraction:.1%})")
    print(f"\naudit: {'PASSED' if audit_passed else 'FAILED'}   report: {report_path}")
    means = {str(v): round(sum(x) / len(x), 4) for v, x in by_version.items()}
    summary = {
        "promoted": good.outcome == "promote", "rolled_back": bad.outcome == "rollback",
        "good_candidate": good.candidate, "bad_candidate": bad.candidate,
        "promote_rule": good.end["rule"] if good.end is not None else None,
        "rollback_rule": bad.end["rule"] if bad.end is not None else None,
        "promote_after_s": promote_after_s, "rollback_after_s": rollback_after_s,
        "bad_candidate_sessions": served, "sessions_while_bad_out": window,
        "bad_candidate_sessions_fraction": round(fraction, 4),
        "reward_by_version": means, "sessions_by_version": {str(v): len(x) for v, x in by_version.items()},
        "answer_probe_by_version": {str(v): round(p, 4) for v, p in probes.items()},
        "sessions": len(sessions.outcomes), "failed_sessions": len(sessions.errors),
        "audit_passed": audit_passed, "report": str(report_path), "elapsed_s": round(elapsed_s, 1),
        **(extra or {}),  # --upstream vllm: each call's recorded version against vLLM's report
    }
    print(json.dumps(summary))
    ok = audit_passed and summary["promoted"] and summary["rolled_back"] and not summary.get("version_mismatches")
    return 0 if ok else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options only ``--release`` reads (it also reads --group-size, --concurrency, --seed, --drain-s)."""
    group = parser.add_argument_group("--release", "safe policy release on live traffic (docs/release.md)")
    group.add_argument("--release", action="store_true",
                       help="run the release demo instead: a good candidate ramped and promoted, a bad one "
                            "(trained on the flipped reward) rolled back by the controller, in a state "
                            "directory and Kafka broker of its own")
    group.add_argument("--plan", type=Path, default=None,
                       help=f"the release plan (default: {DEMO_PLAN.relative_to(REPO_ROOT)}, small minimum samples)")
    group.add_argument("--phase-timeout-s", type=float, default=600.0,
                       help="longest wait for the controller to end each release (default 600)")
    group.add_argument("--state-dir", type=Path, default=None,
                       help="where this run keeps its broker, ClickHouse, policies and logs "
                            "(default: var/release-demo/<time>)")
    group.add_argument("--keep-broker", action="store_true", help="leave this run's Kafka broker running")
