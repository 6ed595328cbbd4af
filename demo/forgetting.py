"""``tokentrail demo --production --forget K``: K of the simulated users are forgotten mid-run (issue 31).

Every user's first session carries a canary of their own (a made-up account code in a message), sealed
under the user's data key like all their content (forgetting is on for every service of the run). At
``--forget-at`` of the run the first K users stop, their session windows close, and the demo forgets them
through the gateway's admin route (keys destroyed, Forgotten events; the sink blanks ClickHouse when it
stores them). At the end: a residue scan of every topic partition, the spool, every ClickHouse table and
the report for the forgotten users' canaries and their token runs (``residual_readable``, must be 0), and
the trainer steps after the forget that used a forgotten user's sample (``trained_after_forget``, must be 0).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokentrail.settings import Settings

FORGET_ENV = {"TOKENTRAIL_FORGET__ENABLED": "true"}


def make_canary(user: str) -> str:
    """One token-friendly made-up word per user: found in a store only if that user's content is readable."""
    return f"zq{user.rsplit('-', 1)[-1]}x{secrets.token_hex(5)}canary"


def canary_message(canary: str) -> str:
    return f"My account code is {canary} please keep it private."


class CanaryNotes:
    """Plants each user's canary in the user's first ``sessions`` sessions, not in all of them.

    The note is a user message after the question, so it changes the task: in every session, the untrained
    policy answered half as often (reward of version 0: 0.165 against 0.34-0.39 without it, 6-minute runs)
    and the reward bands barely rose (0.165, 0.111, 0.059, 0.213, 0.186). The residue scan needs one planted
    copy per user: every store that keeps the user's content keeps that session's.
    """

    def __init__(self, canaries: dict[str, str], sessions: int = 1) -> None:
        self.canaries, self.sessions = canaries, sessions
        self._planted: dict[str, int] = {}

    def note(self, user: str) -> str | None:
        """The note for ``user``'s next session (each user runs in one thread: no lock needed)."""
        canary = self.canaries.get(user)
        if canary is None or self._planted.get(user, 0) >= self.sessions:
            return None
        self._planted[user] = self._planted.get(user, 0) + 1
        return canary_message(canary)


@dataclass
class ForgetRun:
    """Which users are forgotten, when, and by which requests."""

    count: int
    at_fraction: float
    subjects: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    stored: list[str] = field(default_factory=list)  # what their records carry (pseudonyms, subject_names.py)
    done_at_us: int = 0  # when the forget (and the key refresh wait) completed

    def due(self, started: float, minutes: float) -> bool:
        return self.count > 0 and not self.subjects and time.monotonic() >= started + self.at_fraction * minutes * 60

    def forget(self, settings: Settings, users: Any, gateway_url: str, idle_s: float) -> None:
        from tokentrail.forgetting import forget

        chosen = list(range(self.count))
        subjects = [users.user_name(n) for n in chosen]
        print(f"  forgetting {len(subjects)} users ({', '.join(subjects)}): their sessions end first", flush=True)
        users.retire(chosen, timeout_s=300)
        time.sleep(idle_s + 2)  # idle-ended windows close (their finish sealed under the key being destroyed)
        summary = forget(settings, subjects, requested_by="demo operator", reason="simulated erasure request",
                         gateway=gateway_url, clickhouse=False, wait=True,
                         progress=lambda line: print(f"  {line}", flush=True))
        self.subjects, self.requests = subjects, list(summary["requests"])
        self.stored = [form for s in subjects for form in summary["stored_subjects"][s]]
        self.done_at_us = time.time_ns() // 1000
        print(f"  forgotten: {len(subjects)} users, {summary['keys_destroyed']} keys destroyed "
              f"(requests {', '.join(self.requests)})", flush=True)


def forget_figures(settings: Settings, run: ForgetRun, canaries: dict[str, str], report_path: Path) -> dict[str, Any]:
    """residual_readable (the scan) and trained_after_forget (ClickHouse), for the JSON line."""
    from producers.gateway.text_side import ModelTextSide
    from schemas.residue import Needles, canary_token_run
    from sinks.client import connect
    from tokentrail.forgetting import reinstall, uninstall
    from tokentrail.residue_scan import ScanTargets, scan_residue

    if not run.subjects:
        return {"forgotten_subjects": 0, "residual_readable": None, "trained_after_forget": None}
    reinstall(settings)  # the scan decodes with every key that is left, as any consumer would
    text = ModelTextSide.from_dir(settings.model.dir)
    wanted = [canaries[s] for s in run.subjects]
    needles = Needles(tuple(wanted), tuple(canary_token_run(text.encode_text, c) for c in wanted))
    client = connect(settings.clickhouse)
    try:
        tally = scan_residue(needles, ScanTargets(kafka_timeout_s=600, reports=(report_path,)), settings=settings,
                             client=client, progress=lambda line: print(f"  scan: {line}", flush=True))
    finally:  # the run's broker stops next: nothing of this process may keep asking it
        uninstall()
    trained = int(client.query(
        "SELECT count() FROM trainer_steps FINAL ARRAY JOIN sample_ids AS sid WHERE created_at_us > {t:Int64} "
        "AND sid IN (SELECT event_id FROM samples FINAL WHERE subject IN {s:Array(String)})",
        parameters={"t": run.done_at_us, "s": run.stored}).result_rows[0][0])
    trained_before = int(client.query(
        "SELECT count() FROM trainer_steps FINAL ARRAY JOIN sample_ids AS sid WHERE created_at_us <= {t:Int64} "
        "AND sid IN (SELECT event_id FROM samples FINAL WHERE subject IN {s:Array(String)})",
        parameters={"t": run.done_at_us, "s": run.stored}).result_rows[0][0])
    print(f"  residue scan: {tally.residual_readable} readable locations of the forgotten users "
          f"(complete: {tally.complete}); their samples trained before the forget: {trained_before}, after: "
          f"{trained}", flush=True)
    return {"forgotten_subjects": len(run.subjects), "forget_requests": run.requests,
            "residual_readable": tally.residual_readable, "residual_scan_complete": tally.complete,
            "residual_scanned": dict(sorted(tally.scanned.items())),
            "trained_after_forget": trained, "trained_before_forget": trained_before}
