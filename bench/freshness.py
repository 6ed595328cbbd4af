"""Freshness: how long a finished rollout takes to become a sample the trainer holds (issue 30).

Real parts: the local broker, one processors worker subprocess (``tokentrail process``, the faust app)
on private, prefixed topics, and the trainer's own consumer (``SampleStream`` with its batch builder,
batch size 8, cut when full or after its idle time). Rollouts finish on a schedule at each rate (and
group size), then a burst of whole groups at once followed by silence.

Every stage is timed by the record it wrote: the benchmark's topics keep the broker's append time
(``message.timestamp.type=LogAppendTime``), and a rollout's finish is its CompletedRollout's own
``created_at_us`` (its latest input's time). Per rollout:

  call -> on Kafka         each call record's append time - the call's end
  finish -> rollout        the CompletedRollout on tokentrail.rollouts
  ready -> group           the RolloutGroup holding it; "ready" is the group's last member's finish
  ready -> sample          the last Sample naming the rollout, on tokentrail.samples
  ready -> trainer         the trainer's consumer took that sample from Kafka
  trainer queue wait       from taken to cut into a batch (the batch filling up)
  own finish -> sample     from the rollout's own finish: adds the wait for its group's later members

The headline ``finish_to_sample_*`` is ready -> sample: what the pipeline adds once a group is whole
(a group of 8 at 20 rollouts/s spends 350 ms just finishing). ``quiet_tail_ms``: the burst's last
finish to its last sample on the topic, with nothing arriving after it.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from bench.common import emit
from bench.freshness_probe import StageTimes, TrainerProbe, read_stage_times
from bench.freshness_workload import Phase, ScheduledProducer, phase_events
from processors.stream.topics import StreamTopics, ensure_stream_topics
from schemas.codec import get_codec
from schemas.kafka.config import admin_config, consumer_config, producer_config
from schemas.local_paths import REPO_ROOT
from testkit.kafka_read import delete_topics_by_prefix
from tokentrail import kafka_local
from tokentrail.runtime.process import start_worker_process, stop_worker_process
from tokentrail.settings import Settings, get_settings

DEFAULT_RATE = 20.0
# The reward configuration of the benchmark: the default's, without the group filters, so groups of
# one (no variance) yield samples too.
REWARD_YAML = """version: 1
name: freshness-bench
metrics:
  - {name: correct, verifier: answer_match, path: score, weight: 1.0, on_error: filter}
combine: weighted_sum
filters: {zero_variance: false, min_group_size: 1, partial_groups: keep}
normalize: {method: grpo, scale_by_std: true, std_ddof: 0, eps: 1.0e-6}
clip: [-5.0, 5.0]
"""


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    arr = np.asarray(values, dtype=float)
    return {"p50": round(float(np.percentile(arr, 50)), 1), "p99": round(float(np.percentile(arr, 99)), 1),
            "max": round(float(arr.max()), 1)}


def phase_figures(times: StageTimes, phase: Phase, rollouts: list[str], probe: TrainerProbe) -> dict[str, Any]:
    """The stage latencies (ms) of one phase's rollouts, and checks that can fail."""
    members: dict[str, list[str]] = defaultdict(list)  # group event id (or the rollout, ungrouped) -> rollouts
    for rid in rollouts:
        members[times.group_of.get(rid, rid)].append(rid)
    # "ready": the group's last member finished; its samples cannot exist before.
    ready = {rid: max(times.finish_ms.get(r, math.inf) for r in members[times.group_of.get(rid, rid)])
             for rid in rollouts}
    stages: dict[str, list[float]] = {k: [] for k in ("call_to_kafka", "finish_to_rollout", "ready_to_group",
                                                      "ready_to_sample", "ready_to_trainer", "trainer_queue_wait",
                                                      "own_finish_to_sample")}
    # A rollout still on its way (a phase past the throughput limit) lacks a stage record: not timed.
    missing = {r for r in rollouts if r not in times.finish_ms or r not in times.rollout_ms
               or r not in times.group_ms or not times.sample_ms.get(r)}
    untrained = 0
    order_violations = 0
    for rid in rollouts:
        stages["call_to_kafka"] += times.calls_ms.get(rid, [])
        if rid in missing:
            continue
        finish, sample = times.finish_ms[rid], max(times.sample_ms[rid])
        stages["finish_to_rollout"].append(times.rollout_ms[rid] - finish)
        stages["ready_to_group"].append(times.group_ms[rid] - ready[rid])
        stages["ready_to_sample"].append(sample - ready[rid])
        stages["own_finish_to_sample"].append(sample - finish)
        positions = times.sample_pos[rid]
        if any(pos not in probe.stream.consumed_at for pos in positions):
            untrained += 1
            continue
        taken = {pos: probe.stream.consumed_at[pos] for pos in positions}  # wall seconds
        taken_ms = max(taken.values()) * 1000
        stages["ready_to_trainer"].append(taken_ms - ready[rid])
        stages["trainer_queue_wait"] += [(probe.batched_at[pos] - at) * 1000 for pos, at in taken.items()
                                         if pos in probe.batched_at]
        # Each stage's record comes after the one it derives from (ms clock: equal is in order). A group
        # and its samples are sent together, to different partitions: either may be appended first.
        if not (times.rollout_ms[rid] <= min(times.group_ms[rid], sample) and sample <= taken_ms + 1):
            order_violations += 1
    finished = [times.finish_ms[r] for r in rollouts if r in times.finish_ms]
    last_sample = max((max(times.sample_ms[r]) for r in rollouts if times.sample_ms.get(r)), default=None)
    span_s = (last_sample - min(finished)) / 1000 if finished and last_sample else None
    out: dict[str, Any] = {
        "rate_rollouts_per_s": phase.rate, "group_size": phase.group_size, "rollouts": len(rollouts),
        "rollouts_with_samples": len(rollouts) - len(missing), "rollouts_trained": len(rollouts) - len(missing)
        - untrained, "stage_order_violations": order_violations,
        "partial_groups": sum(1 for r in rollouts if times.group_status.get(r) not in (None, "FULL")),
        "delivered_rollouts_per_s": round(len(rollouts) / span_s, 1) if span_s else None,
    }
    for name, values in stages.items():
        for stat, value in percentiles(values).items():
            out[f"{name}_{stat}_ms"] = value
    if finished and last_sample:
        out["tail_ms"] = round(last_sample - max(finished), 1)  # the last finish to the last sample
    return out


def build_phases(default_rate: float, rates: list[float], group_size: int, seconds: float, burst_groups: int,
                 extra_group_sizes: list[int]) -> list[Phase]:
    """The default rate (and the other group sizes at it) and the burst first, then the other rates
    upwards: the ladder stops at the first rate the worker cannot keep up with."""
    def at(rate: float, size: int) -> Phase:
        groups = max(2, math.ceil(rate * seconds / size))
        return Phase(f"rate{rate:g}g{size}".replace(".", "p"), rate, size, groups)

    phases = [at(default_rate, group_size)] + [at(default_rate, size) for size in extra_group_sizes]
    phases.append(Phase("burst", 0.0, group_size, burst_groups))
    return phases + [at(rate, group_size) for rate in sorted(rates) if rate != default_rate]


class FreshnessRig:
    """Private topics (broker append times), one worker, the timed producer and the trainer probe."""

    def __init__(self, base: Settings, args: argparse.Namespace, fetch_max_wait_ms: int) -> None:
        self.tag = uuid.uuid4().hex[:8]
        self.workdir = Path(tempfile.mkdtemp(prefix="tokentrail-bench-freshness-"))
        reward = self.workdir / "reward.yaml"
        reward.write_text(REWARD_YAML)
        self.settings = base.model_copy(update={"processors": base.processors.model_copy(update={
            "app_id": f"bench-fresh-{self.tag}", "state_dir": self.workdir / "state", "reward_config": reward,
            "fetch_max_wait_ms": fetch_max_wait_ms})})
        self.topics = StreamTopics(f"bench-fresh-{self.tag}.")
        self.args = args
        self.codec = get_codec()
        self.log_path = self.workdir / "worker.log"
        self.worker: Any = None
        self.probe: TrainerProbe | None = None
        self.cpu_ms_per_rollout: dict[str, float] = {}  # the worker's CPU time per rollout, by phase

    def start(self) -> None:
        kafka = self.settings.kafka
        ensure_stream_topics(kafka, self.topics)
        admin = AdminClient(admin_config(kafka))
        # The broker stamps every record with its append time: each stage is timed by its own record.
        resources = [ConfigResource("topic", spec.name, incremental_configs=[
            ConfigEntry("message.timestamp.type", "LogAppendTime",
                        incremental_operation=AlterConfigOpType.SET)]) for spec in self.topics.specs()]
        for future in admin.incremental_alter_configs(resources).values():
            future.result(timeout=30)
        wait_for_log_append_time(admin, [r.name for r in resources])
        self.worker = start_worker_process(self.settings, topic_prefix=self.topics.prefix, log_path=self.log_path,
                                           loglevel="warning", extra_args=self.args.worker_args)
        self.producer = ScheduledProducer(producer_config(kafka), self.topics, self.codec)
        conf = consumer_config(kafka, f"bench-fresh-trainer-{self.tag}", **{"auto.offset.reset": "earliest"})
        self.probe = TrainerProbe(conf, self.topics.output("Sample"), self.args.batch_size,
                                  self.args.trainer_idle_s).start()

    def run_phase(self, phase: Phase, seed: int) -> tuple[list[str], bool]:
        """Produce the phase on its schedule and wait until the trainer took every sample it yields;
        the phase's rollouts, and whether that happened within the timeout (False: the worker fell
        behind for good, the rate is past what it can keep up with)."""
        assert self.probe is not None
        start_us = round((time.time() + 0.3) * 1e6)
        timed = phase_events(self.tag, phase, start_us, self.args.calls, self.args.prompt, self.args.output, seed)
        rollouts = sorted({rec["rollout_id"] for _, (_, rec) in timed})
        expected = self.probe.consumed() + phase.rollouts * self.args.calls  # one sample per call
        print(f"  {phase.name}: {phase.rollouts} rollouts in {phase.groups} groups of {phase.group_size}"
              f"{f' at {phase.rate:g}/s' if phase.rate else ' at once'} (load {loadavg()}) ...", flush=True)
        cpu_before = process_cpu_s(self.worker.pid)
        self.producer.run(timed)
        deadline = time.monotonic() + self.args.timeout_s
        while self.probe.consumed() < expected:
            if self.worker.poll() is not None or self.probe.error is not None:
                tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])
                raise RuntimeError(f"freshness: {phase.name}: the trainer took {self.probe.consumed()} of "
                                   f"{expected} samples (probe error {self.probe.error!r})\n{tail}")
            if time.monotonic() > deadline:
                print(f"  {phase.name}: {expected - self.probe.consumed()} samples still missing "
                      f"{self.args.timeout_s:g} s after the last finish", flush=True)
                return rollouts, False
            time.sleep(0.05)
        self.cpu_ms_per_rollout[phase.name] = round((process_cpu_s(self.worker.pid) - cpu_before) * 1000
                                                    / phase.rollouts, 2)
        time.sleep(self.args.trainer_idle_s + 0.5)  # the last partial batch is cut after the idle time
        return rollouts, True

    def read(self) -> StageTimes:
        conf = consumer_config(self.settings.kafka, f"bench-fresh-reader-{self.tag}")
        t = self.topics
        return read_stage_times(conf, t.calls, t.rollouts, t.output("RolloutGroup"), t.output("Sample"))

    def close(self) -> None:
        if self.probe is not None:
            self.probe.stop()
        if self.worker is not None:
            stop_worker_process(self.worker)
        delete_topics_by_prefix(admin_config(self.settings.kafka),
                                [self.topics.prefix, f"{self.settings.processors.app_id}-"])


def wait_for_log_append_time(admin: AdminClient, names: list[str], timeout_s: float = 30.0) -> None:
    """Until every topic reports the broker's append time (an altered config shows a moment later)."""
    deadline = time.monotonic() + timeout_s
    while True:
        resources = [ConfigResource("topic", name) for name in names]
        described = {r.name: f.result(timeout=30) for r, f in admin.describe_configs(resources).items()}
        late = [n for n, cfg in described.items() if cfg["message.timestamp.type"].value != "LogAppendTime"]
        if not late:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"topics without LogAppendTime after {timeout_s:g}s: {late}")
        time.sleep(0.2)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; 0.0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def run_rig(base: Settings, args: argparse.Namespace, phases: list[Phase], fetch_max_wait_ms: int,
            label: str) -> tuple[dict[str, dict[str, Any]], list[Phase], StageTimes]:
    """One worker (with this fetch wait) through the phases; the figures of those it ran."""
    rig = FreshnessRig(base, args, fetch_max_wait_ms)
    try:
        rig.start()
        print(f"{label}: worker fetch wait {fetch_max_wait_ms} ms (load {loadavg()}); warming up ...", flush=True)
        rig.run_phase(Phase("warm", 0.0, args.group_size, 1), seed=0)
        by_phase: dict[str, tuple[list[str], bool]] = {}
        for i, phase in enumerate(phases):
            by_phase[phase.name] = rig.run_phase(phase, seed=i + 1)
            if not by_phase[phase.name][1]:
                break  # past the throughput limit: a faster rate only adds backlog
        ran = [p for p in phases if p.name in by_phase]
        times = rig.read()
        assert rig.probe is not None
        figures = {p.name: {**phase_figures(times, p, by_phase[p.name][0], rig.probe),
                            "delivered": by_phase[p.name][1],
                            "worker_cpu_ms_per_rollout": rig.cpu_ms_per_rollout.get(p.name)} for p in ran}
    finally:
        rig.close()
    return figures, ran, times


def measure(args: argparse.Namespace) -> dict[str, Any]:
    base = get_settings()
    if not kafka_local.broker_answers(base.kafka):
        raise SystemExit(f"no Kafka broker answers on {base.kafka.bootstrap_servers} (`tokentrail kafka start`)")
    phases = build_phases(args.default_rate, args.rates, args.group_size, args.seconds, args.burst_groups,
                          args.extra_group_sizes)
    fetch_wait = args.fetch_max_wait_ms if args.fetch_max_wait_ms is not None else base.processors.fetch_max_wait_ms
    baseline = None
    if args.baseline_fetch_max_wait_ms:
        # The same workload at the default rate and the burst on a worker with faust's fetch wait, just
        # before the measured run: the ratios compare back-to-back runs on the same (shared) machine.
        figures, ran, times = run_rig(base, args, [p for p in phases if p.rate in (args.default_rate, 0.0)],
                                      args.baseline_fetch_max_wait_ms, "baseline")
        baseline = report(figures, ran, args, times, emit_line=False)
    figures, ran, times = run_rig(base, args, phases, fetch_wait, "measured")
    out = report(figures, ran, args, times, emit_line=False)
    out["fetch_max_wait_ms"] = fetch_wait
    if baseline is not None:
        out["baseline"] = {"fetch_max_wait_ms": args.baseline_fetch_max_wait_ms,
                           **{k: v for k, v in baseline.items() if k != "per_rate"},
                           "per_rate": baseline["per_rate"]}
        for key in ("finish_to_sample_p50_ms", "finish_to_sample_p99_ms", "quiet_tail_ms", "finish_to_trainer_p99_ms"):
            before, after = baseline.get(key), out.get(key)
            out[f"{key}_vs_baseline"] = round(after / before, 3) if before and after is not None else None
    emit(out)
    return out


def report(figures: dict[str, dict[str, Any]], phases: list[Phase], args: argparse.Namespace, times: StageTimes,
           emit_line: bool = True) -> dict[str, Any]:
    cols = ("call_to_kafka", "finish_to_rollout", "ready_to_group", "ready_to_sample", "ready_to_trainer",
            "trainer_queue_wait", "own_finish_to_sample")
    print(f"\n  ms, p50 / p99 / max (load {loadavg()})")
    print("  " + "phase".ljust(16) + "".join(c.ljust(22) for c in cols) + "rollouts/s")
    for p in phases:
        f = figures[p.name]
        cells = "".join(f"{f[f'{c}_p50_ms']} / {f[f'{c}_p99_ms']} / {f[f'{c}_max_ms']}".ljust(22) for c in cols)
        print(f"  {p.name.ljust(16)}{cells}{f['delivered_rollouts_per_s']}  ({f['worker_cpu_ms_per_rollout']} "
              "worker CPU ms/rollout)")
    default = next((p for p in phases if p.rate == args.default_rate and p.group_size == args.group_size),
                   next(p for p in phases if p.rate > 0))
    burst = figures["burst"]
    d = figures[default.name]
    out: dict[str, Any] = {
        "rate_rollouts_per_s": default.rate, "group_size": default.group_size,
        "finish_to_sample_p50_ms": d["ready_to_sample_p50_ms"], "finish_to_sample_p99_ms": d["ready_to_sample_p99_ms"],
        "finish_to_sample_max_ms": d["ready_to_sample_max_ms"],
        "finish_to_trainer_p99_ms": d["ready_to_trainer_p99_ms"], "call_to_kafka_p99_ms": d["call_to_kafka_p99_ms"],
        "worker_cpu_ms_per_rollout": d.get("worker_cpu_ms_per_rollout"),
        "quiet_tail_ms": burst.get("tail_ms"), "quiet_tail_trainer_ms": burst.get("ready_to_trainer_max_ms"),
        "rollouts": sum(f["rollouts"] for f in figures.values()),
        "rollouts_with_samples": sum(f["rollouts_with_samples"] for f in figures.values()),
        "rollouts_trained": sum(f["rollouts_trained"] for f in figures.values()),
        "stage_order_violations": sum(f["stage_order_violations"] for f in figures.values()),
        "undelivered_phases": [name for name, f in figures.items() if not f["delivered"]],
        "not_log_append_time": sum(times.not_log_append.values()),
        "not_log_append_topics": sorted(times.not_log_append),
        "loadavg": loadavg(),
        "per_rate": {p.name: figures[p.name] for p in phases},
    }
    if emit_line:
        emit(out)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.freshness", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=float, nargs="+", default=[1, 20, 50, 100, 200],
                        help="rollouts finished per second, one phase each (default 1 20 50 100 200)")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per group (default 8)")
    parser.add_argument("--extra-group-sizes", type=int, nargs="*", default=[1],
                        help="more group sizes, at the default rate (default 1)")
    parser.add_argument("--default-rate", type=float, default=DEFAULT_RATE,
                        help=f"the rate of the headline figures and the baseline (default {DEFAULT_RATE:g})")
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each rate phase (default 6)")
    parser.add_argument("--burst-groups", type=int, default=2, help="whole groups finished at once (default 2)")
    parser.add_argument("--calls", type=int, default=2, help="model calls per rollout (default 2)")
    parser.add_argument("--prompt", type=int, default=256, help="first prompt tokens (default 256)")
    parser.add_argument("--output", type=int, default=64, help="output tokens per call (default 64)")
    parser.add_argument("--batch-size", type=int, default=8, help="the trainer's batch size (default 8)")
    parser.add_argument("--trainer-idle-s", type=float, default=5.0,
                        help="the trainer's idle time before it cuts a partial batch (default 5, its own)")
    parser.add_argument("--timeout-s", type=float, default=60.0,
                        help="per phase, from its last finish to all its samples taken (default 60)")
    parser.add_argument("--worker-args", nargs="*", default=[], help="extra arguments for `tokentrail process`")
    parser.add_argument("--fetch-max-wait-ms", type=int, default=None,
                        help="the worker's fetch wait (default: the processors setting)")
    parser.add_argument("--baseline-fetch-max-wait-ms", type=int, default=1500,
                        help="first run the default rate and the burst on a worker with this fetch wait "
                             "(default 1500, faust's own) and report the ratios; 0: no baseline")
    parser.add_argument("--quick", action="store_true",
                        help="a small run for CI: one rate (20/s), groups of 8 and 1, a burst of one group")
    args = parser.parse_args(argv)
    if args.quick:
        args.default_rate, args.rates, args.extra_group_sizes, args.seconds, args.burst_groups = (
            DEFAULT_RATE, [DEFAULT_RATE], [1], 0.5, 1)
        args.baseline_fetch_max_wait_ms = 0
        args.trainer_idle_s = min(args.trainer_idle_s, 1.0)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"freshness: rates {args.rates} rollouts/s, groups of {args.group_size} (+{args.extra_group_sizes}), "
          f"burst {args.burst_groups} groups; repo {REPO_ROOT}", flush=True)
    measure(args)


if __name__ == "__main__":
    main()
