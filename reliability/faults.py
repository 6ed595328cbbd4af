"""Fault scenarios with real processes on this machine; each reports what was lost and duplicated.

* ``broker_and_gateway``  a private broker (own ports and data dir; the shared one is never touched) is
  stopped mid-run while a gateway process keeps answering from its spool, then restarted: every record
  arrives exactly once (fault a). Then the broker is stopped again, the gateway fills its spool and is
  killed -9, the broker returns and a new gateway on the same spool drains it (fault e).
* ``worker_kills``  kill -9 of the processors worker at random points, restarted each time: the
  deduplicated outputs equal what the pure core derives (a clean run) (fault b).
* ``sink_kills``  the ClickHouse sink killed -9 mid-stream and restarted: after FINAL, one row per
  event id, none missing (fault c).
* ``double_delivery``  every input record delivered twice: same ids, no duplicate samples (fault d).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from reliability.pipeline import Pipeline, compare, core_outputs, workload
from reliability.results import FaultResult
from reliability.sink_runner import query_sink, run_sink_until_caught_up, start_sink
from schemas.ids import call_id
from testkit.kafka_read import count_event_ids, create_topics, lost_and_duplicated
from tokentrail import kafka_local
from tokentrail.runtime.process import settings_env
from tokentrail.settings import REPO_ROOT, KafkaSettings, Settings

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Sizes:
    rollouts_per_phase: int  # gateway scenario: rollouts driven in each phase
    calls_per_rollout: int
    worker_groups: int  # worker scenario: groups per batch (4 rollouts x 4 calls each)
    worker_kills: int
    sink_kills: int


QUICK = Sizes(rollouts_per_phase=6, calls_per_rollout=2, worker_groups=3, worker_kills=5, sink_kills=3)
FULL = Sizes(rollouts_per_phase=20, calls_per_rollout=3, worker_groups=8, worker_kills=5, sink_kills=5)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ------------------------------------------------------------------------------------ gateway + broker


class GatewayProcess:
    """``tokentrail gateway`` as a child process with the given settings."""

    def __init__(self, settings: Settings, log_path: Path) -> None:
        self.settings, self.log_path = settings, log_path
        self.url = f"http://{settings.gateway.host}:{settings.gateway.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 180.0) -> None:
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tokentrail.cli", "gateway", "--log-level", "warning"], cwd=REPO_ROOT,
                env=settings_env(self.settings), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the gateway exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"the gateway did not answer within {timeout_s:g}s; see {self.log_path}")

    def health(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def metric(self, name: str) -> float:
        """One unlabelled sample of the gateway's Prometheus metrics (what an operator's dashboard sees)."""
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(f"{name} is not among the gateway's metrics")

    def wait_drained(self, timeout_s: float) -> bool:
        """Whether the gateway's spool emptied (everything it acknowledged reached Kafka) in time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.health().get("sink", {}).get("spool_depth", 1) == 0:
                return True
            time.sleep(0.5)
        return False

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill9()


def drive_rollout(gateway_url: str, model: str, index: int, calls: int, tag: str) -> set[str]:
    """One rollout through the real openai SDK and the env API; the ids of every record it produced."""
    import openai

    with httpx.Client(base_url=gateway_url, timeout=120) as client:
        started = client.post("/v1/rollouts", json={"rollout_id": f"fault-{tag}-{index}",
                                                    "task_input": {"answer": "4"}})
        started.raise_for_status()
        info = started.json()
        rid, aid = info["rollout_id"], info["attempt_id"]
        ids = {info["event_id"]}
        oa = openai.OpenAI(base_url=info["openai_base_url"], api_key="k", max_retries=0, timeout=120)
        messages: list[Any] = [{"role": "user", "content": f"rollout {index}: what is 2 + 2?"}]
        for i in range(calls):
            reply = oa.chat.completions.create(model=model, messages=messages, max_tokens=4)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                         {"role": "user", "content": "and again?"}]
            ids.add(call_id(rid, aid, i))
        base = f"/v1/rollouts/{rid}/attempts/{aid}"
        event = client.post(f"{base}/events", json={"kind": "TOOL_RESULT", "payload": {"i": index},
                                                    "call_index": calls - 1})
        event.raise_for_status()
        ids.add(event.json()["events"][0]["event_id"])
        finished = client.post(f"{base}/finish", json={"status": "SUCCESS"})
        finished.raise_for_status()
        ids.add(finished.json()["event_id"])
    return ids


class Driver:
    """Drives rollouts one after another in a thread, collecting acknowledged record ids."""

    def __init__(self, url: str, model: str, calls: int, tag: str) -> None:
        self.url, self.model, self.calls, self.tag = url, model, calls, tag
        self.ids: set[str] = set()
        self.done = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next = 0

    def run_n(self, n: int) -> None:
        for _ in range(n):
            self._one()

    def _one(self) -> None:
        index = self._next
        self._next += 1
        try:
            self.ids |= drive_rollout(self.url, self.model, index, self.calls, self.tag)
            self.done += 1
        except Exception as exc:  # reported as a failure of the scenario
            self.errors.append(f"rollout {index}: {exc!r}")

    def start_background(self) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                self._one()

        self._thread = threading.Thread(target=loop, name="fault-driver", daemon=True)
        self._thread.start()

    def stop_background(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(300)


def broker_and_gateway(settings: Settings, workdir: Path, sizes: Sizes, progress: Progress) -> list[FaultResult]:
    """Faults (a) and (e) on a private broker; returns one result for each."""
    workdir.mkdir(parents=True, exist_ok=True)
    kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}", controller_port=free_port(),
                          data_dir=workdir / "kafka", heap="512m", partitions=2,
                          lib_dir=settings.kafka.lib_dir)
    gw_settings = settings.gateway.model_copy(update={"port": free_port(), "spool_dir": workdir / "spool",
                                                      "delivery_timeout_s": 1.0})
    private = settings.model_copy(update={"kafka": kafka, "gateway": gw_settings})
    quiet: Progress = lambda _line: None  # noqa: E731
    began = time.monotonic()
    kafka_local.start(wait_s=180, kafka=kafka, echo=quiet)
    results: list[FaultResult] = []
    gateway = GatewayProcess(private, workdir / "gateway.log")
    try:
        topics = ["tokentrail.calls", "tokentrail.env"]
        create_topics(kafka.client_config(), topics)
        gateway.start()
        progress(f"fault a: private broker on {kafka.bootstrap_servers} and a gateway process up "
                 f"({time.monotonic() - began:.0f}s)")
        model = settings.model.name

        # (a) broker stopped and restarted while rollouts keep running.
        t0 = time.monotonic()
        driver = Driver(gateway.url, model, sizes.calls_per_rollout, "a")
        driver.run_n(2)
        driver.start_background()
        kafka_local.stop(timeout_s=60, kafka=kafka, echo=quiet)
        before = driver.done
        deadline = time.monotonic() + 120
        while driver.done < before + sizes.rollouts_per_phase and time.monotonic() < deadline:
            time.sleep(0.2)
        answered_while_down = driver.done - before
        depth = gateway.health()["sink"]["spool_depth"]
        metric_depth = gateway.metric("tokentrail_gateway_spool_depth")  # /metrics shows it too
        progress(f"fault a: broker stopped; {answered_while_down} rollouts answered meanwhile, spool depth {depth}")
        kafka_local.start(wait_s=180, kafka=kafka, echo=quiet)
        time.sleep(1.0)
        driver.stop_background()
        drained = gateway.wait_drained(120)
        counts = count_event_ids(kafka.client_config(), topics, driver.ids, timeout_s=90)
        lost, dup = lost_and_duplicated(counts, driver.ids)
        drained_metric = gateway.metric("tokentrail_gateway_spool_depth") if drained else -1.0
        ok = (drained and not driver.errors and answered_while_down > 0 and depth > 0 and metric_depth > 0
              and drained_metric == 0 and lost == dup == 0)
        results.append(FaultResult(
            "a. Kafka broker stopped + restarted", f"{driver.done} rollouts ({len(driver.ids)} records), "
            f"{answered_while_down} answered while the broker was down (spool depth {depth}, "
            f"{metric_depth:.0f} on /metrics)",
            lost, dup, ok, "; ".join(driver.errors[:3]) + ("" if drained else " spool not drained"),
            seconds=time.monotonic() - t0))
        progress(f"fault a: lost {lost}, duplicated {dup}")

        # (e) gateway killed -9 with a non-empty spool; a new gateway on the same spool drains it.
        t0 = time.monotonic()
        kafka_local.stop(timeout_s=60, kafka=kafka, echo=quiet)
        spooled = Driver(gateway.url, model, sizes.calls_per_rollout, "e")
        spooled.run_n(max(2, sizes.rollouts_per_phase // 2))
        depth = gateway.health()["sink"]["spool_depth"]
        gateway.kill9()
        progress(f"fault e: gateway killed -9 with {depth} records in its spool")
        kafka_local.start(wait_s=180, kafka=kafka, echo=quiet)
        gateway = GatewayProcess(private, workdir / "gateway.log")
        gateway.start()
        drained = gateway.wait_drained(120)
        after = Driver(gateway.url, model, sizes.calls_per_rollout, "e2")
        after.run_n(2)
        expected = spooled.ids | after.ids
        counts = count_event_ids(kafka.client_config(), topics, expected, timeout_s=90)
        lost, dup = lost_and_duplicated(counts, expected)
        errors = spooled.errors + after.errors
        ok = drained and depth > 0 and not errors and lost == dup == 0
        results.append(FaultResult(
            "e. gateway kill -9 with a non-empty spool", f"{spooled.done} rollouts spooled ({depth} records), "
            f"gateway restarted on the spool, then {after.done} more", lost, dup, ok,
            "; ".join(errors[:3]) + ("" if drained else " spool not drained"), seconds=time.monotonic() - t0))
        progress(f"fault e: lost {lost}, duplicated {dup}")
    finally:
        gateway.stop()
        kafka_local.stop(timeout_s=60, kafka=kafka, echo=quiet)
    return results


# ------------------------------------------------------------------------------------ worker + sink


def worker_and_sink_kills(settings: Settings, workdir: Path, sizes: Sizes, progress: Progress,
                          seed: int = 0) -> list[FaultResult]:
    """Faults (b) and (c) on one private pipeline of the shared broker."""
    rng = np.random.default_rng(seed)
    pipeline = Pipeline.create(settings, workdir / "kills")
    # A worker restarted after kill -9 may itself crash on what the kill left (e.g. a commit refused
    # because the group moved on): it stops so that it restarts from committed offsets, and a supervisor
    # restarts it. That is the designed recovery, so it is allowed a few times and reported.
    pipeline.crash_restarts_allowed = 3
    results: list[FaultResult] = []
    try:
        batches = [workload(f"k{i}", sizes.worker_groups, seed=seed * 10 + i) for i in range(3)]
        inputs = [ev for b in batches for ev in b]
        expected = core_outputs(inputs, pipeline.settings)
        names = [n for n in expected if n != "DeadLetter"]
        t0 = time.monotonic()
        kills = 0
        for batch_index, batch in enumerate(batches):
            pipeline.produce(batch)
            per_batch = sizes.worker_kills // len(batches) + (batch_index < sizes.worker_kills % len(batches))
            for _ in range(per_batch):
                worker = pipeline.start_worker()
                seen = sum(len(v) for v in pipeline.collected.records.values())
                # A random point: after the worker has produced something new, plus a random delay.
                pipeline.collect(lambda c, s=seen: sum(len(v) for v in c.records.values()) > s, timeout_s=90)
                time.sleep(float(rng.uniform(0.0, 1.5)))
                pipeline.kill(worker)
                kills += 1
                progress(f"fault b: worker killed -9 ({kills}/{sizes.worker_kills}); "
                         f"{len(pipeline.collected.ids('Sample'))} of {len(expected['Sample'])} samples so far")
        pipeline.start_worker()
        pipeline.collect(lambda c: all(set(expected[n]) <= c.ids(n) for n in names), timeout_s=180)
        got = pipeline.settle(quiet_s=3.0)
        cmp = compare(got, expected, names)
        dead = len(got.records["DeadLetter"])
        passed = cmp.lost == cmp.duplicated == dead == 0
        detail = cmp.detail + (f"; {pipeline.watchdog_restarts} watchdog restart(s) of a stuck worker"
                               if pipeline.watchdog_restarts else "")
        if pipeline.crash_causes:
            causes = "\n".join(pipeline.crash_causes)
            detail += f"; {len(pipeline.crash_causes)} crashed worker(s) restarted:\n{causes}"
            progress(f"fault b: {len(pipeline.crash_causes)} crashed worker(s) restarted by the supervisor")
        if dead:
            first = got.records["DeadLetter"][0]
            detail += f"; {dead} dead letter(s), first: {first.get('stage')} {first.get('reason')!r}"
        if not passed:
            detail += f"\nworker log (last lines):\n{pipeline.log_tail(60)}"
        results.append(FaultResult(
            "b. processor worker kill -9", f"{kills} kills at random points over {len(inputs)} input records "
            f"({len(expected['Sample'])} samples expected)", cmp.lost, cmp.duplicated + dead,
            passed, detail, cmp.redelivered, time.monotonic() - t0))
        progress(f"fault b: lost {cmp.lost}, duplicated {cmp.duplicated} ({cmp.redelivered} identical redeliveries)")
        pipeline.stop_workers()
        results.append(_sink_kills(pipeline, inputs, expected, workdir, sizes, rng, progress))
    finally:
        pipeline.close()
    return results


def _sink_kills(pipeline: Pipeline, inputs: list[Any], expected: dict[str, dict[str, Any]], workdir: Path,
                sizes: Sizes, rng: np.random.Generator, progress: Progress) -> FaultResult:
    from sinks.rows import TABLE_OF

    t0 = time.monotonic()
    dsn = f"chdb://{workdir / 'kills' / 'chdb'}"
    log = workdir / "kills" / "sink.log"
    group = f"{pipeline.settings.processors.app_id}-sink"
    prefix = pipeline.topics.prefix
    inputs = list(inputs)
    for k in range(sizes.sink_kills):
        # Fresh input records for each run, so every run has rows to store when it is killed.
        extra = workload(f"sink{k}", sizes.worker_groups, seed=500 + k)
        pipeline.produce(extra)
        inputs += extra
        mark = log.stat().st_size if log.exists() else 0
        proc = start_sink(pipeline.settings, prefix, dsn, group, log, idle_s=30.0, batch_rows=5)
        storing = _wait_for_rows(log, mark, proc, timeout_s=60)
        time.sleep(float(rng.uniform(0.0, 0.5)))  # a random point while it is inserting
        proc.kill()
        proc.wait(30)
        progress(f"fault c: sink killed -9 ({k + 1}/{sizes.sink_kills}) "
                 f"{'while storing rows' if storing else 'before it stored anything'}")
    runs = run_sink_until_caught_up(pipeline.settings, prefix, dsn, group, log)
    stored = query_sink(pipeline.settings, dsn)
    want: dict[str, set[str]] = {}
    for name, rec in inputs:
        want.setdefault(TABLE_OF[name], set()).add(rec["event_id"])
    for name, records in expected.items():
        if name != "DeadLetter":
            want.setdefault(TABLE_OF[name], set()).update(records)
    missing = {table: len(ids - set(stored["ids"][table])) for table, ids in want.items()}
    lost = sum(missing.values())
    duplicated = sum(t["final"] - t["unique"] for t in stored["tables"].values())
    raw_extra = sum(t["raw"] - t["final"] for t in stored["tables"].values())
    rows = sum(len(ids) for ids in want.values())
    detail = f"{raw_extra} raw rows collapsed by FINAL; caught up in {runs} sink run(s) after the kills"
    if lost or duplicated:
        copies = {t: v["final"] - v["unique"] for t, v in stored["tables"].items() if v["final"] > v["unique"]}
        detail += f"; missing by table {({t: n for t, n in missing.items() if n})}, duplicated by table {copies}"
    return FaultResult("c. ClickHouse sink kill -9", f"{sizes.sink_kills} kills, {rows} events to store",
                       lost, duplicated, lost == duplicated == 0, detail, raw_extra, time.monotonic() - t0)


def _wait_for_rows(log: Path, mark: int, proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait until this sink run logged a progress line with stored rows (its log from ``mark`` on)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        with open(log, "rb") as fh:
            fh.seek(mark)
            text = fh.read().decode(errors="replace")
        if any(line.startswith("sink: ") and " 0 rows" not in line for line in text.splitlines()):
            return True
        time.sleep(0.2)
    return False


def double_delivery(settings: Settings, workdir: Path, sizes: Sizes, progress: Progress) -> FaultResult:
    """Fault (d): every input record twice (as a re-sent spool would); same ids, no duplicate samples."""
    t0 = time.monotonic()
    pipeline = Pipeline.create(settings, workdir / "twice")
    try:
        events = workload("twice", max(2, sizes.worker_groups // 2), seed=77)
        expected = core_outputs(events, pipeline.settings)
        names = [n for n in expected if n != "DeadLetter"]
        pipeline.produce(events)
        pipeline.produce(events)
        pipeline.start_worker()
        pipeline.collect(lambda c: all(set(expected[n]) <= c.ids(n) for n in names), timeout_s=120)
        got = pipeline.settle(quiet_s=3.0)
        cmp = compare(got, expected, names)
        copies = sum(n - 1 for n in got.counts("Sample").values())
        dead = len(got.records["DeadLetter"])
        duplicated = cmp.duplicated + copies + dead
        progress(f"fault d: lost {cmp.lost}, duplicated {duplicated}")
        return FaultResult("d. every record delivered twice", f"{len(events)} input records sent twice "
                           f"({len(expected['Sample'])} samples expected)", cmp.lost, duplicated,
                           cmp.lost == duplicated == 0, cmp.detail, cmp.redelivered, time.monotonic() - t0)
    finally:
        pipeline.close()
