"""``tokentrail demo``: the main job, end to end on this machine.

Brings up Kafka, the embedded ClickHouse, the gateway on the embedded engine, the stream processors,
the ClickHouse sink and the trainer; runs agent rollouts of the lookup task through the official
``openai`` SDK; trains online (the engine follows each new policy version); then drains the pipeline,
runs the five audit checks and writes the HTML report. Prints the reward per policy version.

With ``--upstream vllm`` the gateway serves from a vLLM server (CPU build from .venv-vllm, started here)
instead, and keeps it on the trainer's versions with the weight sync (docs/weight-sync.md): every call
records the version vLLM sampled it with.

With ``--family F`` (qwen3, qwen3-coder, llama3, gpt-oss) every service serves and trains the family's model
instead of the reference model: its real vocabulary, chat template and output format on random weights
(``tokentrail model build --family F``, built here if needed). The loop and the audit are the same; the
reward stays near zero (a random-weight model does not answer the lookup task).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

import httpx

from demo import production, release_guard
from demo.agent import RolloutOutcome, run_rollout
from demo.environment import make_task
from demo.progress import ProgressTracker, VersionStats, version_bands
from demo.release import add_arguments as add_release_arguments
from demo.release import run_release_demo
from demo.services import Service, http_ok, log_dir, wait_until
from demo.steps import bring_up, run_cli, step
from demo.vllm import DemoVLLM, stored_version_evidence
from models.families.spec import FAMILIES
from sinks.settings import ClickHouseSettings
from tokentrail.settings import REPO_ROOT, Settings, get_settings

STATE_DIRS = ("kafka", "clickhouse", "policies", "spool", "processors", "logs")


def _fresh_state(settings: Settings) -> None:
    run_cli("kafka", "stop")
    for name in STATE_DIRS:
        shutil.rmtree(settings.var_dir / name, ignore_errors=True)


class Workload:
    """Keeps ``concurrency`` groups of rollouts in flight until the deadline."""

    def __init__(self, gateway_url: str, model: str, group_size: int, concurrency: int, seed: int) -> None:
        self.gateway_url, self.model, self.group_size = gateway_url, model, group_size
        self.pool = ThreadPoolExecutor(max_workers=concurrency * group_size, thread_name_prefix="agent")
        self.concurrency, self.next_seed = concurrency, seed
        self.outcomes: list[RolloutOutcome] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def _group(self) -> list[Future[RolloutOutcome]]:
        task = make_task(self.next_seed)
        group_id = f"{task.task_id}-g"
        self.next_seed += 1
        return [self.pool.submit(run_rollout, self.gateway_url, self.model, task, group_id, self.group_size)
                for _ in range(self.group_size)]

    def run_until(self, deadline: float, on_tick: Callable[[int], None],
                  enough: Callable[[], bool] = lambda: False) -> None:
        """Starts groups until the deadline or until ``enough()`` says so, then lets the last ones finish."""
        in_flight: set[Future[RolloutOutcome]] = set()
        groups_started = 0
        last_tick = time.monotonic()

        def starting() -> bool:
            return time.monotonic() < deadline and not enough()

        while starting() or in_flight:
            while starting() and len(in_flight) < self.concurrency * self.group_size:
                in_flight.update(self._group())
                groups_started += 1
            done, in_flight = wait(in_flight, timeout=1.0, return_when=FIRST_COMPLETED)
            for future in done:
                try:
                    self.outcomes.append(future.result())
                except Exception as exc:  # a failed rollout is reported, the run goes on
                    self.errors.append(repr(exc))
            if time.monotonic() - last_tick >= 10:
                on_tick(groups_started)
                last_tick = time.monotonic()
        self.pool.shutdown()


def _workload_defaults(args: argparse.Namespace) -> None:
    """Groups of 4 with 4 in flight behind vLLM: a group's samples reach the trainer within its staleness
    bound, and the reward by version moves past the noise of a few tasks (docs/weight-sync.md, run C);
    the embedded engine keeps groups of 8, 2 in flight."""
    main_on_vllm = args.upstream == "vllm" and not getattr(args, "release", False) \
        and not getattr(args, "production", False)
    if args.group_size is None:
        args.group_size = 4 if main_on_vllm else 8
    if args.concurrency is None:
        args.concurrency = 4 if main_on_vllm else 2


def use_family(family: str) -> None:
    """Serve and train the family's model in this process and every service it starts: the model settings
    (``TOKENTRAIL_MODEL__FAMILY``/``DIR``/``NAME``) set in the environment the services inherit."""
    import os

    from models.families.build import build_family
    from models.families.spec import family_named

    settings = get_settings()
    model_dir = build_family(settings.model.families_dir / family, family_named(family), progress=print)
    os.environ.update({"TOKENTRAIL_MODEL__FAMILY": family, "TOKENTRAIL_MODEL__DIR": str(model_dir),
                       "TOKENTRAIL_MODEL__NAME": f"tokentrail-{family}"})
    get_settings.cache_clear()


def run_demo(args: argparse.Namespace) -> int:
    _workload_defaults(args)
    if getattr(args, "family", None):
        use_family(args.family)
    if getattr(args, "release", False):
        return run_release_demo(args)
    if getattr(args, "production", False):  # organic sessions, rewards from feedback (production.py)
        return production.run_production(args)
    settings = get_settings()
    total = 8
    if not args.keep_data:
        _fresh_state(settings)
    bring_up(total, "Kafka broker (KRaft, jars from Maven Central)")

    logs = log_dir()
    gateway_url = f"http://{settings.gateway.host}:{settings.gateway.port}"
    vllm: DemoVLLM | None = None
    if args.upstream == "vllm":
        vllm = DemoVLLM(settings.model.dir, settings.model.name, logs / "vllm.log", url=args.vllm_url)
        print(f"  {'using' if vllm.external else 'starting'} vLLM at {vllm.url} (2-4 minutes on 2 cores; "
              f"log {vllm.log_path}) ...", flush=True)
        print(f"  vLLM ready in {vllm.start():.0f} s", flush=True)
    # The release guard is armed as in production (demo/release_guard.py): nothing changes until
    # someone starts a release.
    controller = release_guard.controller_service(logs)
    services = [
        Service("gateway", ["gateway"], logs / "gateway.log",
                env={**release_guard.FOLLOW_RELEASES_ENV, **(vllm.gateway_env() if vllm else {})}),
        # A stuck worker stops itself after 60 s (watchdog) and the supervision below restarts it.
        Service("processors", ["process", "--stall-timeout", "60"], logs / "processors.log"),
        Service("sink", ["sink"], logs / "sink.log"),
        # Without --lr the trainer takes its learning rate from the settings.
        Service("trainer", ["train", "--batch-size", str(args.train_batch), "--steps-per-version", "1",
                            *(["--lr", str(args.lr)] if args.lr is not None else []), "--threads", "1",
                            # The engine decides the default mismatch correction (TIS behind vLLM).
                            "--upstream", args.upstream, "--flush-partial", *release_guard.TRAINER_ARGS,
                            # Several ranks: torchrun (gloo) on this host, rank 0 reads and publishes.
                            *(["--nproc", str(args.trainer_ranks), "--max-restarts", "1"] if args.trainer_ranks > 1
                              else [])], logs / "trainer.log"),
        controller,
    ]
    step(4, total, f"services: {', '.join(s.name for s in services)} (logs in {logs})")
    tracker: ProgressTracker | None = None
    served_label = ""
    try:
        for service in services:
            service.start()
        wait_until(http_ok(f"{gateway_url}/health"), 600, "the gateway", services[0])  # a bound: slow when loaded
        tracker = ProgressTracker(settings)
        tracker.start()

        until = f" or {args.until_steps} trainer steps" if args.until_steps else ""
        step(5, total, f"online RL: {args.minutes:g} min{until} of lookup-task rollouts, groups of {args.group_size}, "
                        f"{args.concurrency} groups in flight")
        workload = Workload(gateway_url, settings.model.name, args.group_size, args.concurrency, args.seed)
        start = time.monotonic()
        ticks = [0]

        def tick(groups: int) -> None:
            for service in services:
                if not service.alive():  # supervise: a restarted service resumes from Kafka
                    print(f"  {service.name} exited (code {service.process and service.process.returncode}); "
                          "restarting it", flush=True)
                    service.start()
            elapsed = time.monotonic() - start
            print(f"  {elapsed:5.0f}s  groups {groups}  {tracker.line()}", flush=True)
            ticks[0] += 1
            if ticks[0] % 6 == 0:  # about every minute: where the records are, stage by stage
                print(f"         {tracker.topic_counts()}; gateway {_gateway_delivery(gateway_url)}", flush=True)

        until_steps = args.until_steps
        workload.run_until(start + args.minutes * 60, tick,
                           enough=lambda: until_steps is not None and tracker.trainer_steps >= until_steps)
        failed_rollouts = len(workload.errors)
        correct = sum(o.correct for o in workload.outcomes)
        print(f"  workload done: {len(workload.outcomes)} rollouts, {correct} answered right, "
              f"{len(workload.errors)} failed" + (f" (first: {workload.errors[0]})" if workload.errors else ""))

        step(6, total, "draining: processors close the last groups, the trainer takes the last samples")
        _drain(tracker, args.drain_s, len(workload.outcomes))
        print(f"  {tracker.topic_counts()}", flush=True)
        for service in reversed(services):
            service.stop()
        tracker.stop()
        tracker_summary = tracker.reward_by_version()
        served_label = vllm.weight_label() if vllm else ""
    finally:
        for service in services:
            service.stop()
        if vllm is not None:
            vllm.stop()
    step(7, total, "ClickHouse catch-up, then the five audit checks")
    run_cli("sink", "--once")
    audit = subprocess.run([sys.executable, "-m", "tokentrail.cli", "audit"], cwd=REPO_ROOT)
    step(8, total, "report")
    report_path = settings.var_dir / "report.html"
    run_cli("report", "--out", str(report_path))
    guard = release_guard.guard_summary(controller.log_path)
    print(f"  {release_guard.guard_line(guard)}", flush=True)
    extra: dict[str, object] = {"upstream": args.upstream, **guard}
    trained = trained_exactly_once(settings.clickhouse)
    print(f"  samples trained exactly once (TrainerStep sample ids against the samples table): {trained}", flush=True)
    extra.update(trained)
    off_policy = tracker.off_policy() if tracker is not None else {}
    print(f"  engine/trainer logprob mismatch and staleness: {off_policy}", flush=True)
    extra.update(off_policy)
    versions_wrong = False
    if vllm is not None:
        # Checked, not assumed: every stored call's recorded version against the weights vLLM says sampled
        # its tokens (and the gate's lease); a mismatch or a call vLLM gave no version for fails the run.
        evidence = stored_version_evidence(settings.clickhouse)
        print(f"  versions, call by call: {evidence}", flush=True)
        extra.update(evidence, failed_rollouts=failed_rollouts, vllm_final_weight_label=served_label,
                     newest_recorded_version=max(tracker_summary, default=0))
        versions_wrong = bool(evidence["version_mismatches"] or evidence["calls_without_vllm_version"])
    exactly_once_failed = bool(trained["samples_trained_twice"] or trained["samples_lost"])
    return _summarize(tracker_summary, audit.returncode, report_path, extra) or int(versions_wrong) \
        or int(exactly_once_failed)


def trained_exactly_once(clickhouse: ClickHouseSettings) -> dict[str, object]:
    """From ClickHouse (after the sink's catch-up): the ranks the trainer ran on, how many samples it trained,
    how many twice, how many no step accounts for (``trainer_consumer.step_audit``)."""
    from sinks.client import connect
    from trainer_consumer.step_audit import exactly_once

    client = connect(clickhouse)
    try:
        steps = client.query("SELECT event_id, sample_ids, stale_dropped_ids, filtered_json, ranks, sample_ranks "
                             "FROM trainer_steps FINAL").named_results()
        samples = [r[0] for r in client.query("SELECT event_id FROM samples FINAL").result_rows]
    finally:
        client.close()
    figures = exactly_once(steps, samples).figures()
    return {k: figures[k] for k in ("ranks", "samples_trained", "samples_trained_twice", "samples_lost",
                                    "samples_filtered_by_count", "rank_samples")}


def _gateway_delivery(gateway_url: str) -> str:
    """The gateway's delivery state from /health: a growing spool means calls are not reaching Kafka."""
    try:
        sink = httpx.get(f"{gateway_url}/health", timeout=5.0).json().get("sink", {})
    except (httpx.HTTPError, ValueError) as exc:
        return f"health unavailable ({type(exc).__name__})"
    return ", ".join(f"{k} {v}" for k, v in sink.items()) or "no sink stats"


# Drained: the tracker has seen every finished rollout rewarded and every sample accounted for by the trainer,
# and nothing new for DRAINED_QUIET_S (a record between two stages shows up well within it); or, whatever the
# tracker says, nothing new for QUIET_S.
DRAINED_QUIET_S = 10.0
QUIET_S = 30.0


def _drain(tracker: ProgressTracker, budget_s: float, rollouts_finished: int) -> None:
    deadline = time.monotonic() + budget_s
    last = (-1, -1)
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        now = (tracker.samples, tracker.trainer_steps)
        if now != last:
            last, quiet_since = now, time.monotonic()
            print(f"  {tracker.line()}", flush=True)
        else:
            quiet = time.monotonic() - quiet_since
            if quiet > QUIET_S or (quiet > DRAINED_QUIET_S and tracker.drained(rollouts_finished)):
                print(f"  drained ({quiet:.0f} s with nothing new)", flush=True)
                return
        time.sleep(1)


def _summarize(by_version: dict[int, VersionStats], audit_rc: int, report_path: Path,
               extra: dict[str, object] | None = None) -> int:
    bands = version_bands(by_version)
    print("\nreward (fraction answered right) by policy version:")
    for first, last, mean, count in bands:
        print(f"  v{first:<3}-v{last:<4} {mean:.3f}  ({count} rollouts)")
    first_mean = bands[0][2] if bands else float("nan")
    last_mean = bands[-1][2] if bands else float("nan")
    improved = last_mean > first_mean
    if bands and not improved:
        # The pipeline's promise (the audit) does not depend on learning, but a person reading this
        # expects the reward to rise; say plainly that it did not and what to try.
        print("\nnote: the reward did not rise this run. Online RL on the tiny random-weight model is noisy, "
              "and a policy can lose its tool-call format late in a run. Try another --seed, a lower --lr, "
              "or more --minutes; the audit below is unaffected.")
    print(f"\naudit: {'PASSED' if audit_rc == 0 else 'FAILED'}   report: {report_path}")
    summary = {"policy_versions": len(by_version), "reward_first_band": first_mean,
               "reward_last_band": last_mean, "reward_improved": improved,
               "audit_passed": audit_rc == 0, "report": str(report_path), **(extra or {})}
    print(json.dumps(summary))
    return 0 if audit_rc == 0 else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="the main job: online RL end to end on the embedded defaults",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=8.0, help="how long to run the workload (default 8)")
    p.add_argument("--until-steps", type=int, default=None, metavar="N",
                   help="end the workload once the trainer has taken N optimizer steps (or at --minutes, "
                        "whichever comes first): the reward depends on steps, not wall time, so a short run "
                        "on a loaded machine still trains as far")
    p.add_argument("--group-size", type=int, default=None,
                   help="rollouts per group (default 8; 4 with --upstream vllm)")
    p.add_argument("--concurrency", type=int, default=None,
                   help="groups in flight at once (default 2; 4 with --upstream vllm)")
    p.add_argument("--train-batch", type=int, default=16, help="samples per optimizer step (default 16)")
    p.add_argument("--trainer-ranks", type=int, default=1,
                   help="train on N torch.distributed ranks (tokentrail train --nproc N, gloo on CPU); the last "
                        "line reports samples trained, trained twice and lost from the TrainerStep events")
    p.add_argument("--lr", type=float, default=None,
                   help="trainer learning rate (default: the trainer setting, 2e-4)")
    p.add_argument("--seed", type=int, default=0, help="first task seed (default 0)")
    p.add_argument("--drain-s", type=float, default=120.0, help="longest wait for the pipeline to drain")
    p.add_argument("--upstream", choices=("embedded", "vllm"), default="embedded",
                   help="the engine behind the gateway: the embedded reference engine (default) or a vLLM "
                        "server started here from .venv-vllm (make setup-vllm), kept on each published "
                        "version by the weight sync")
    p.add_argument("--vllm-url", default=None, metavar="URL",
                   help="with --upstream vllm: use this running server (started like the demo starts one: "
                        "VLLM_SERVER_DEV_MODE=1, --enable-scale-out, processed logprobs, the reference model) "
                        "instead of starting one; its weights are left at the last version")
    p.add_argument("--family", default=None, choices=sorted(FAMILIES),
                   help="serve and train a model family's random-weight model (its real vocabulary, chat "
                        "template and parser) instead of the reference model; built here if needed")
    p.add_argument("--keep-data", action="store_true",
                   help="keep var/ (Kafka data, ClickHouse, policies) from an earlier run instead of starting fresh")
    add_release_arguments(p)
    p.add_argument("--production", action="store_true",
                   help="production shape instead: simulated users through the openai SDK with no rollout "
                        "creation (organic sessions), rewards from their delayed feedback alone, late feedback "
                        "used by replay (demo/production.py)")
    production.add_arguments(p)
    p.set_defaults(func=run_demo)
