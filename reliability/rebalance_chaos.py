"""Fault (h), rebalance chaos: processor workers are added and removed every 20-30 s (full: five
minutes; quick: at least 75 s, about 90) while a steady workload is produced into a private pipeline on the shared
broker; afterwards the outputs must equal what the pure core derives from the same inputs.

Membership changes follow a fixed cycle from two workers: add one, stop one gracefully (SIGTERM: faust
commits and leaves), kill one -9 (no commit, no goodbye), add one; so every run has both kinds of
removal and between one and three workers at any time. Which worker goes and the pause between changes
are drawn from a seeded generator. Workers have static-membership slots (``Pipeline.start_worker``), so
a new worker takes a vacated slot. Groups close by size and attempts never time out within a run,
so the outputs do not depend on how loaded the machine is.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from reliability.pipeline import Event, Pipeline, compare, core_outputs, workload
from reliability.results import FaultResult
from tokentrail.runtime.process import stop_worker_process
from tokentrail.settings import Settings

Progress = Callable[[str], None]
NAME = "h. rebalance chaos: workers added and removed"
CYCLE = ("add", "sigterm", "kill -9", "add")
FIRST_WORKERS = 2


@dataclass(frozen=True)
class ChaosSizes:
    duration_s: float  # how long workers are added and removed while the workload runs
    pause_s: tuple[float, float]  # between two membership changes (drawn uniformly)
    group_every_s: float  # the steady workload: one group of four rollouts produced this often
    partitions: int


QUICK = ChaosSizes(duration_s=75.0, pause_s=(20.0, 30.0), group_every_s=3.0, partitions=4)
FULL = ChaosSizes(duration_s=300.0, pause_s=(20.0, 30.0), group_every_s=3.0, partitions=4)


@dataclass
class ChaosRun:
    """The fault's result plus the membership changes made (kind, seconds into the run, workers after)."""

    result: FaultResult
    changes: list[tuple[str, float, int]] = field(default_factory=list)


class SteadyWorkload:
    """Produces one group every ``every_s`` seconds in a thread until stopped; keeps what it produced."""

    def __init__(self, pipeline: Pipeline, every_s: float, tag: str) -> None:
        self.pipeline, self.every_s, self.tag = pipeline, every_s, tag
        self.events: list[Event] = []
        self.groups = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-workload", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            batch = workload(f"{self.tag}{self.groups}", 1, seed=1000 + self.groups)
            try:
                self.pipeline.produce(batch)
            except Exception as exc:  # reported as a failure of the scenario
                self.error = repr(exc)
                return
            self.events += batch
            self.groups += 1
            self._stop.wait(self.every_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)


def live_workers(pipeline: Pipeline) -> list[subprocess.Popen]:
    return [p for p in pipeline.workers if p.poll() is None]


def change_membership(pipeline: Pipeline, kind: str, rng: np.random.Generator) -> None:
    """Add a worker, or remove a random live one gracefully (SIGTERM) or with kill -9. A removed worker
    leaves the pipeline's list, so only an unexpected exit counts as a crash."""
    if kind == "add":
        pipeline.start_worker()
        return
    live = live_workers(pipeline)
    victim = live[int(rng.integers(len(live)))]
    if kind == "sigterm":
        stop_worker_process(victim, timeout_s=60)
    else:
        pipeline.kill(victim)
    pipeline.workers.remove(victim)


def rebalance_chaos(settings: Settings, workdir: Path, sizes: ChaosSizes, progress: Progress,
                    seed: int = 0) -> FaultResult:
    return run_rebalance_chaos(settings, workdir, sizes, progress, seed).result


def run_rebalance_chaos(settings: Settings, workdir: Path, sizes: ChaosSizes, progress: Progress,
                        seed: int = 0) -> ChaosRun:
    rng = np.random.default_rng(seed)
    t0 = time.monotonic()
    pipeline = Pipeline.create(settings, workdir / "chaos", partitions=sizes.partitions,
                               group_window_s=3600.0, attempt_timeout_s=3600.0)
    run = ChaosRun(FaultResult(NAME, "", 0, 0, False))
    crashed: list[int] = []
    try:
        for _ in range(FIRST_WORKERS):
            pipeline.start_worker()
        steady = SteadyWorkload(pipeline, sizes.group_every_s, f"chaos{seed}-")
        steady.start()
        began = time.monotonic()
        step = 0
        while time.monotonic() - began < sizes.duration_s:  # the last change lands at or past the duration
            pause = float(rng.uniform(*sizes.pause_s))
            due = time.monotonic() + pause
            if not pipeline.collect(lambda _c, d=due: time.monotonic() >= d, timeout_s=pause + 5):
                crashed += [p.returncode for p in pipeline.workers if p.poll() not in (None, 0, -9)]
                if crashed:
                    break
            kind = CYCLE[step % len(CYCLE)]
            change_membership(pipeline, kind, rng)
            step += 1
            run.changes.append((kind, time.monotonic() - began, len(live_workers(pipeline))))
            progress(f"fault h: {kind} at {time.monotonic() - began:.0f}s -> {len(live_workers(pipeline))} "
                     f"worker(s); {steady.groups} groups produced, "
                     f"{len(pipeline.collected.ids('Sample'))} samples out so far")
        if not crashed:  # the last change, too, is followed by load before the workload stops
            tail_s = sizes.pause_s[0] / 2
            pipeline.collect(lambda _c, d=time.monotonic() + tail_s: time.monotonic() >= d, timeout_s=tail_s + 5)
        steady.stop()
        chaos_s = time.monotonic() - began
        run.result = _settle_and_compare(pipeline, steady, run, crashed, chaos_s, progress, t0)
        return run
    finally:
        pipeline.close()


def _settle_and_compare(pipeline: Pipeline, steady: SteadyWorkload, run: ChaosRun, crashed: list[int],
                        chaos_s: float, progress: Progress, t0: float) -> FaultResult:
    expected = core_outputs(steady.events, pipeline.settings)
    names = [n for n in expected if n != "DeadLetter"]
    if len(live_workers(pipeline)) < FIRST_WORKERS:  # the last change may have left one: finish sooner
        pipeline.start_worker()
    progress(f"fault h: chaos over after {chaos_s:.0f}s ({len(run.changes)} changes); waiting for "
             f"{len(expected['Sample'])} samples of {steady.groups} groups")
    covered = pipeline.collect(lambda c: all(set(expected[n]) <= c.ids(n) for n in names), timeout_s=300)
    got = pipeline.settle(quiet_s=3.0)
    cmp = compare(got, expected, names)
    dead = len(got.records["DeadLetter"])
    crashed += [p.returncode for p in pipeline.workers if p.poll() not in (None, 0, -9)]
    kinds = [kind for kind, _, _ in run.changes]
    both_removals = "sigterm" in kinds and "kill -9" in kinds
    passed = (cmp.lost == cmp.duplicated == dead == 0 and covered and not crashed and steady.error is None
              and both_removals and bool(expected["Sample"]))
    detail = cmp.detail
    for failed, why in ((not covered, "outputs did not cover the expected ones (300s at most)"),
                        (bool(crashed), f"workers exited with {crashed}"), (dead > 0, f"{dead} dead letters"),
                        (not both_removals, "not both kinds of removal happened"),
                        (steady.error is not None, f"the workload failed: {steady.error}")):
        if failed:
            detail += f"; {why}"
    if pipeline.watchdog_restarts:
        detail += f"; {pipeline.watchdog_restarts} watchdog restart(s) of a stuck worker"
    if not passed:
        detail += f"\nworker log (last lines):\n{pipeline.log_tail(60)}"
    counts = {k: kinds.count(k) for k in dict.fromkeys(CYCLE)}
    tried = (f"{len(run.changes)} membership changes in {chaos_s:.0f}s ({counts['add']} added, "
             f"{counts['sigterm']} SIGTERM, {counts['kill -9']} kill -9) under {steady.groups} groups "
             f"({len(steady.events)} input records, {len(expected['Sample'])} samples expected)")
    progress(f"fault h: lost {cmp.lost}, duplicated {cmp.duplicated + dead} ({cmp.redelivered} identical "
             f"redeliveries)")
    return FaultResult(NAME, tried, cmp.lost, cmp.duplicated + dead, passed, detail, cmp.redelivered,
                       time.monotonic() - t0)
