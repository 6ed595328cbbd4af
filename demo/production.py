"""``tokentrail demo --production``: online RL from production feedback, end to end on this machine.

Simulated end users drive the demo agent (the lookup task, one tool) through the official ``openai`` SDK.
Nobody creates a rollout: each user's calls carry their end-user id (OpenAI ``user``) and the gateway's
organic sessions (producers/gateway/sessions.py) turn every session window into a rollout, ended
explicitly (``POST /v1/sessions/{key}/end``) or by an idle gap. Each user judges the answer they got and
sends feedback of several kinds (thumbs, a rating, an edit outcome with its edit distance, a task outcome)
to ``POST /v1/feedback`` after a random delay; for a fraction of the sessions it is given in time but
delivered only after the join's window closed (late). Rewards come from that feedback alone (the feedback
join; the verifier has no task input to judge a session by: its scores are errors, its rewards filtered); with no
resampled siblings, the baselines (processors/baselines/) measure each session against the sessions of the
same first-message template in its time window, or the template's running baseline, and the trainer trains
on those advantages. At the
end: drain, the five audit checks (the fifth, feedback accounting, exact under the demo's feedback
config), a replay that admits the late feedback (rewards differ exactly on the sessions whose feedback
was late), and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from demo.forgetting import FORGET_ENV, ForgetRun, forget_figures
from demo.production_users import KINDS, FeedbackOutbox, PlannedFeedback, Users, unknown_response_id
from demo.progress import ProgressTracker, VersionStats, version_bands
from demo.services import Service, http_ok, wait_until
from demo.steps import bring_up, private_env, run_cli, step
from schemas.local_paths import DEPLOY_CONFIG_DIR
from tokentrail.forgetting import reinstall, uninstall
from tokentrail.settings import REPO_ROOT, Settings, get_settings

# ---------------------------------------------------------------- the demo's feedback and baseline configs


def demo_feedback_config(wait_s: float, lag_s: float, match_wait_s: float) -> dict[str, Any]:
    """The feedback-reward config of the demo: the deployed one's rules with waits short enough for a run
    of minutes, and the mean of the kinds a user sent."""
    return {"version": 1, "name": "feedback-demo-production",
            "wait_s": {kind: wait_s for kind in (*KINDS, "TEXT")}, "watermark_lag_s": lag_s,
            "match_wait_s": match_wait_s, "closed_retention_s": 3600, "combine": "mean",
            "terminal_kinds": ["OUTCOME", "TASK_OUTCOME"], "weights": {}, "supersede": "replace",
            "missing": "exclude", "default": 0.0,
            "values": {"binary_true": 1.0, "binary_false": 0.0, "accepted": 1.0, "rejected": 0.0,
                       "edited_by_distance": True, "edited": 0.5, "task_success": 1.0, "task_failure": 0.0,
                       "rating_low": 0.0, "rating_high": 1.0}}


def demo_baseline_config(window_s: float, lag_s: float) -> dict[str, Any]:
    """The deployed baseline config (sessions keyed by their first message's template) with windows short
    enough for a run of minutes, small groups, and a prior so a template's first window has advantages.

    Groups are scaled by their standard deviation and clipped as the lab demo's GRPO rewards are
    (deploy/config/reward.yaml): unscaled leave-one-out advantages of 0/1 feedback at a ~30 % success rate
    are about +0.7 / -0.3, less than half the lab demo's, so the same learning rate moved the policy half as
    far per step."""
    cfg = yaml.safe_load((DEPLOY_CONFIG_DIR / "baseline.yaml").read_text())
    cfg["name"] = "baseline-demo-production"
    cfg["window"] = {**cfg["window"], "size_s": window_s}
    cfg["watermark_lag_s"] = lag_s
    cfg["min_group_size"] = 3
    cfg["group"] = {**cfg["group"], "scale_by_std": True}
    cfg["running"] = {**cfg["running"], "prior_mean": 0.5}
    cfg["clip"] = [-5.0, 5.0]
    return cfg


def feedback_delay_s(wait_s: float, lag_s: float, window_s: float) -> float:
    """About how long after a session ends its advantage reaches the trainer: the feedback join closes its
    window ``wait_s + lag_s`` after the session, and the baseline window it falls in closes up to
    ``window_s + lag_s`` later."""
    return wait_s + lag_s + window_s + lag_s



# ---------------------------------------------------------------- progress, from the topics


class FeedbackProgress(ProgressTracker):
    """The demo's live line with rewards from feedback alone (the feedback join's, not filtered)."""

    def _apply(self, name: str, record: dict) -> None:
        if name == "Reward" and ('"source":"feedback"' not in (record.get("components_json") or "")
                                 or record["filtered"]):
            self._seen.add(record["event_id"])
            return
        super()._apply(name, record)


# ---------------------------------------------------------------- the run


@dataclass
class Figures:
    by_version: dict[int, VersionStats] = field(default_factory=dict)
    audit_passed: bool = False
    summary: dict[str, Any] = field(default_factory=dict)


# Explicit, not only through TOKENTRAIL_VAR_DIR: this process read its var dir at import.
def _clickhouse_env(state_dir: Path) -> dict[str, str]:
    return {"TOKENTRAIL_CLICKHOUSE__DSN": f"chdb://{state_dir / 'clickhouse'}"}


def run_production(args: argparse.Namespace) -> int:
    shared = get_settings()
    state_dir = getattr(args, "state_dir", None) or shared.var_dir / "production-demo" / time.strftime("%Y%m%d-%H%M%S")
    state_dir = Path(state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    os.environ.update(private_env(state_dir, shared.model.dir, _clickhouse_env(state_dir)))
    if getattr(args, "forget", 0):  # every service and this process seal subjects' content (issue 31)
        os.environ.update(FORGET_ENV)
    settings = Settings()  # the private settings, for this process's own clients
    # This process seals and opens subjects' content with the keys on its own broker, not the shared one.
    reinstall(settings)
    print(f"production demo in {state_dir} (its own Kafka broker on {settings.kafka.bootstrap_servers})", flush=True)
    try:
        rc, last_line = _run(args, settings, state_dir)
    finally:
        uninstall()  # nothing of this process may keep asking the run's broker once it stops
        if not getattr(args, "keep_broker", False):
            sys.stdout.flush()
            subprocess.run([sys.executable, "-m", "tokentrail.cli", "kafka", "stop"], cwd=REPO_ROOT, check=False)
    print(last_line, flush=True)  # the JSON, last, after the broker's stop lines
    return rc


def _run(args: argparse.Namespace, settings: Settings, state_dir: Path) -> tuple[int, str]:
    total = 9
    bring_up(total, "Kafka broker of this run (KRaft)")

    wait_s, lag_s, match_wait_s = args.feedback_wait_s, args.watermark_lag_s, args.match_wait_s
    config_path = settings.var_dir / "production" / "feedback_reward.yaml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(demo_feedback_config(wait_s, lag_s, match_wait_s), sort_keys=False))
    baseline_path = config_path.parent / "baseline.yaml"
    baseline_path.write_text(yaml.safe_dump(demo_baseline_config(args.baseline_window_s, lag_s), sort_keys=False))
    env = {"TOKENTRAIL_GATEWAY__ORGANIC_SESSIONS": "true",
           "TOKENTRAIL_GATEWAY__SESSION_IDLE_S": str(args.idle_s),
           "TOKENTRAIL_PROCESSORS__FEEDBACK_JOIN": "true",
           "TOKENTRAIL_PROCESSORS__FEEDBACK_CONFIG": str(config_path),
           # Rewards from feedback alone: the verifier stays on (so every verifier reward names its raw
           # score, audit check (c)), but an organic session has no task input, so its score is an ERROR
           # and its verifier reward filtered: no sample comes from it.
           # No resampled siblings: advantages against sessions of the same first message over time.
           "TOKENTRAIL_PROCESSORS__BASELINES": "true",
           "TOKENTRAIL_PROCESSORS__BASELINE_CONFIG": str(baseline_path)}
    logs = state_dir / "logs"
    gateway_url = f"http://{settings.gateway.host}:{settings.gateway.port}"
    services = [
        Service("gateway", ["gateway"], logs / "gateway.log", env=env),
        Service("processors", ["process", "--stall-timeout", "60"], logs / "processors.log", env=env),
        Service("sink", ["sink"], logs / "sink.log", env=env),
        # Feedback reaches the trainer a feedback window and a baseline window after the session; the
        # staleness bound must span the versions made meanwhile, or the trainer drops most samples.
        Service("trainer", ["train", "--batch-size", str(args.train_batch), "--steps-per-version", "1",
                            *(["--lr", str(args.lr)] if args.lr is not None else []), "--threads", "1",
                            "--max-staleness", str(args.max_staleness), "--flush-partial"],
                logs / "trainer.log", env=env),
    ]
    delay = feedback_delay_s(wait_s, lag_s, args.baseline_window_s)
    step(4, total, f"services: {', '.join(s.name for s in services)} (organic sessions, idle gap {args.idle_s:g} s; "
                    f"feedback join, window {wait_s:g} s; advantages reach the trainer ~{delay:g} s after a "
                    f"session, staleness bound {args.max_staleness} versions; logs in {logs})")
    outbox = FeedbackOutbox(gateway_url)
    tracker: FeedbackProgress | None = None
    forgetting = ForgetRun(min(args.forget, args.users - 1), args.forget_at)
    if args.forget > args.users - 1:
        print(f"  --forget {args.forget}: forgetting {forgetting.count} of {args.users} users (one keeps training)")
    try:
        for service in services:
            service.start()
        wait_until(http_ok(f"{gateway_url}/health"), args.startup_s, "the gateway", services[0])
        tracker = FeedbackProgress(settings)
        tracker.start()
        outbox.start()

        step(5, total, f"production traffic: {args.users} users for {args.minutes:g} min through the openai SDK, "
                        f"no rollout created; feedback after random delays, {args.late_fraction:.0%} of sessions late")
        users = Users(gateway_url, settings.model.name, args.users, outbox, seed=args.seed, idle_s=args.idle_s,
                      late_fraction=args.late_fraction, wait_s=wait_s, lag_s=lag_s, explicit_end=args.explicit_end,
                      canaries=forgetting.count > 0)
        for n in range(args.unmatched):  # feedback on responses the gateway never served
            outbox.schedule(time.time() + 5 + n, {"response_id": unknown_response_id(n)},
                            PlannedFeedback("BINARY", {"binary": True}, 0.0, 0.0, False), event_time=time.time())
        start = time.monotonic()

        def tick() -> None:
            for service in services:
                if not service.alive():  # supervise: a restarted service resumes from Kafka
                    print(f"  {service.name} exited; restarting it", flush=True)
                    service.start()
            assert tracker is not None
            if forgetting.due(start, args.minutes):
                forgetting.forget(settings, users, gateway_url, args.idle_s)
            print(f"  {time.monotonic() - start:5.0f}s  sessions {len(users.outcomes)}  feedback sent "
                  f"{len(outbox.sent)} (planned {outbox.pending()})  {tracker.line()}", flush=True)

        users.run_until(start + args.minutes * 60, tick)
        right = sum(o.right for o in users.outcomes)
        print(f"  users done: {len(users.outcomes)} sessions ({right} answered right, "
              f"{sum(o.ended_by == 'idle' for o in users.outcomes)} ended by the idle gap), "
              f"{len(users.errors)} failed" + (f" (first: {users.errors[0]})" if users.errors else ""), flush=True)

        step(6, total, "the last feedback (late ones after their window), then the join closes every window")
        last_due = max([time.time()] + [entry[0] for entry in outbox._queue])
        outbox.close(timeout_s=max(0.0, last_due - time.time()) + 120)
        print(f"  feedback sent: {len(outbox.sent)} ({sum(s.late for s in outbox.sent)} planned late), "
              f"{len(outbox.errors)} refused" + (f" (first: {outbox.errors[0]})" if outbox.errors else ""), flush=True)
        # The join closes a window once stream time passes its end; unmatched feedback waits match_wait_s.
        settle = time.monotonic() + max(wait_s, match_wait_s) + lag_s + 15
        _drain_until(tracker, settle, args.drain_s)
        for service in reversed(services):
            service.stop()
        tracker.stop()
    finally:
        for service in services:
            service.stop()
    step(7, total, "ClickHouse catch-up, then the five audit checks (feedback accounting under the demo's config)")
    run_cli("sink", "--once")
    report_path = state_dir / "report.html"
    run_cli("report", "--out", str(report_path), "--no-audit")
    figures = _audit_and_replay(settings, config_path, users, outbox, total)
    if forgetting.count:
        step(9, total, "forgetting: residue scan of every topic, the spool, ClickHouse and the report; trainer steps")
        figures.summary.update(forget_figures(settings, forgetting, users.canaries, report_path))
    return _summarize_production(figures, users, outbox, report_path)


def _drain_until(tracker: FeedbackProgress, settle_at: float, budget_s: float) -> None:
    """Wait at least until ``settle_at`` (windows close, unmatched feedback expires), then until nothing
    new reaches the topics for 30 s, within ``budget_s``."""
    deadline = time.monotonic() + budget_s
    last, quiet_since = None, time.monotonic()
    while time.monotonic() < deadline:
        now = (tracker.samples, tracker.trainer_steps, len(tracker.reward_by_version()),
               sum(len(s.rewards) for s in tracker.reward_by_version().values()))
        if now != last:
            last, quiet_since = now, time.monotonic()
            print(f"  {tracker.line()}", flush=True)
        elif time.monotonic() >= settle_at and time.monotonic() - quiet_since > 30:
            return
        time.sleep(1)


def _audit_and_replay(settings: Settings, config_path: Path, users: Users, outbox: FeedbackOutbox,
                      total: int) -> Figures:
    from processors.feedback.config import load_feedback_config
    from sinks.audit import CHECKS, check_feedback_accounting, format_table, run_audit
    from sinks.client import connect
    from sinks.feedback_report import feedback_summary
    from sinks.replay import replay_feedback
    from sinks.report import FEEDBACK_CONFIGS

    cfg = load_feedback_config(config_path)
    client = connect(settings.clickhouse)
    results = run_audit(client, only=[k for k in CHECKS if k != "feedback_accounting"])
    results.append(check_feedback_accounting(client, cfg))
    print(format_table(results), flush=True)
    figures = Figures(audit_passed=all(r.passed for r in results))

    rows = client.query("SELECT policy_version, reward FROM v_reward_by_policy WHERE NOT filtered "
                        f"AND reward_config_id IN ({FEEDBACK_CONFIGS}) ORDER BY policy_version").result_rows
    for version, reward in rows:
        figures.by_version.setdefault(int(version), VersionStats()).rewards.append(float(reward))

    summary = feedback_summary(client)
    step(8, total, "replay admitting the late feedback (tokentrail replay --feedback)")
    replay = replay_feedback(client, cfg)
    changed = {row.rollout_id for row in replay.rows if row.changed}
    late_landed = {row.rollout_id for row in replay.rows if row.late_admitted}
    sent_late = {s.event_id for s in outbox.sent if s.late}
    admitted_late = {fid for row in replay.rows for fid in row.late_admitted}
    planned_late_rows = {row.rollout_id for row in replay.rows if sent_late & set(row.late_admitted)}
    print(f"  {len(replay.rows)} rollouts re-derived; {len(changed)} rewards differ; late feedback landed on "
          f"{len(late_landed)} rollouts; differ exactly there: {changed == late_landed}", flush=True)
    for row in [r for r in replay.rows if r.changed][:5]:
        original = ", ".join("filtered" if o["filtered"] else f"{o['reward']:.3f}" for o in row.originals) or "none"
        print(f"    {row.rollout_id}: stream {original} -> replay {row.replayed['reward']:.3f} "
              f"({len(row.late_admitted)} late feedback)", flush=True)
    late = sum(n for outcome, n in summary.outcomes.items() if outcome.startswith("late"))
    figures.summary = {
        "rollouts_complete": summary.rollouts,
        "feedback_events": summary.feedback,
        "feedback_used": summary.outcomes.get("admitted", 0),
        "feedback_late": late,
        "feedback_unmatched": summary.outcomes.get("unmatched", 0),
        "feedback_pending": summary.outcomes.get("pending", 0),
        "feedback_coverage": round(sum(c[2] for c in summary.coverage) / max(1, summary.rollouts), 4),
        "replay_rollouts_changed": len(changed),
        "replay_changed_exactly_where_late": changed == late_landed and bool(changed),
        # The two halves of it that hold whatever the machine's load: no reward changed where no late
        # feedback landed, and every session whose feedback was all sent late changed (its stream reward
        # was filtered). Timely feedback the loaded stream still recorded late can leave a mean unchanged.
        "replay_changed_only_where_late": changed <= late_landed and bool(changed),
        "replay_changed_on_every_late_session": planned_late_rows <= changed,
        "replay_admits_the_late_sent": sent_late <= admitted_late if sent_late else False,
        "delay_median_s_by_kind": {d.kind: d.median_after_close_s for d in summary.delays},
    }
    return figures


def _summarize_production(figures: Figures, users: Users, outbox: FeedbackOutbox,
                          report_path: Path) -> tuple[int, str]:
    """Prints the reward bands and the audit's verdict; returns the exit code and the JSON line."""
    bands = version_bands(figures.by_version)
    print("\nreward from feedback alone, by policy version:")
    for first, last, mean, count in bands:
        print(f"  v{first:<3}-v{last:<4} {mean:.3f}  ({count} sessions)")
    first_mean = bands[0][2] if bands else float("nan")
    last_mean = bands[-1][2] if bands else float("nan")
    improved = len(bands) > 1 and last_mean > first_mean
    print(f"\naudit: {'PASSED' if figures.audit_passed else 'FAILED'}   report: {report_path}")
    summary = {"sessions": len(users.outcomes), "sessions_failed": len(users.errors),
               "sessions_answered_right": sum(o.right for o in users.outcomes),
               **figures.summary, "feedback_sent_late": sum(s.late for s in outbox.sent),
               "feedback_refused": len(outbox.errors), "policy_versions": len(figures.by_version),
               "reward_first_band": first_mean, "reward_last_band": last_mean, "reward_improved": improved,
               "audit_passed": figures.audit_passed, "report": str(report_path)}
    forgot_ok = figures.summary.get("residual_readable") in (None, 0) and \
        figures.summary.get("trained_after_forget") in (None, 0)
    return (0 if figures.audit_passed and forgot_ok else 1), json.dumps(summary)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``--production`` run's own options (``tokentrail demo --production --help``)."""
    g = p.add_argument_group("--production (organic sessions, rewards from feedback)")
    g.add_argument("--users", type=int, default=6, help="simulated users at once (default 6)")
    g.add_argument("--forget", type=int, default=0, metavar="K",
                   help="forget K of the users mid-run (issue 31): sealing on, each user's canary planted, then a "
                        "residue scan and the trainer steps after the forget (demo/forgetting.py)")
    g.add_argument("--forget-at", type=float, default=0.5,
                   help="when to forget, as a fraction of --minutes (default 0.5)")
    g.add_argument("--idle-s", type=float, default=4.0, help="session window: idle gap that ends a session (4)")
    g.add_argument("--explicit-end", type=float, default=0.7,
                   help="fraction of sessions the app ends explicitly; the rest end by the idle gap (0.7)")
    g.add_argument("--late-fraction", type=float, default=0.2,
                   help="fraction of sessions whose feedback comes only after the join's window (0.2)")
    g.add_argument("--feedback-wait-s", type=float, default=30.0,
                   help="the join's window: how long after a session closes its feedback counts (30)")
    g.add_argument("--watermark-lag-s", type=float, default=5.0,
                   help="the feedback join's and the baselines' watermark lag (5)")
    g.add_argument("--baseline-window-s", type=float, default=15.0,
                   help="the baselines' window: sessions of one first-message template within it form a group (15)")
    g.add_argument("--max-staleness", type=int, default=32,
                   help="the trainer's staleness bound in policy versions (32; the deployed 4 is for lab groups "
                        "trained seconds after sampling: feedback comes a minute later, when the trainer has made "
                        "a dozen versions, and a bound of 4 dropped two thirds of the samples)")
    g.add_argument("--match-wait-s", type=float, default=30.0,
                   help="how long feedback waits for the session it names before it is unmatched (30)")
    g.add_argument("--startup-s", type=float, default=600.0,
                   help="longest wait for the gateway to answer (loads the model; slow on a loaded machine) (600)")
    g.add_argument("--unmatched", type=int, default=3,
                   help="feedback events sent on responses the gateway never served (3)")
