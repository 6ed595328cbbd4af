"""The report's release section (issue 22): which versions served the traffic over time, each version's reward
with an interval, and every release decision on the timeline and in a table with the interval it was taken on.

Reads ``calls`` (the version that produced each call's tokens), ``rewards`` joined to complete rollouts served
by one version (what the release controller compares: ``raw_reward``, verifier rewards only: not feedback
rewards, nor those measured against a baseline; rewards filtered for a score error left out),
``release_decisions``, the release arm of each call (``CallRecord.release``: pinned evaluation traffic per pin,
kept out of the shares and rewards, and every arm checked against the decision log) and the trainer's resume
events (``trainer_steps`` rows with ``resumed_from_version``: after a rollback the trainer went back to the last
good version). Plots are base64 PNG like the rest of the report.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import matplotlib.pyplot as plt
from clickhouse_connect.driver.client import Client

from sinks.feedback_store import IS_FEEDBACK_REWARD

Html = Callable[..., str]

# Pinned (evaluation) traffic, by CallRecord.release (migration 0014), is reported per pin and kept out of the
# versions' shares and rewards, as the controller keeps it out of the comparison.
NOT_PINNED = "ifNull(release_arm, '') != 'pinned'"
PINNED_ROLLOUTS = "SELECT rollout_id FROM calls FINAL WHERE release_arm = 'pinned'"

CALL_SHARES = f"""
SELECT toStartOfInterval(event_time, INTERVAL {{bucket_s}} SECOND) AS t, policy_version, count()
FROM calls FINAL WHERE NOT scripted AND {NOT_PINNED} GROUP BY t, policy_version ORDER BY t, policy_version"""

VERIFIER_REWARD = f"""NOT (w.filtered AND startsWith(ifNull(w.filter_reason, ''), 'score_error'))
  AND NOT ({IS_FEEDBACK_REWARD})
  AND JSONExtractString(w.components_json, 'source') != 'baseline'  -- restates a feedback reward"""

REWARD_BY_VERSION = f"""
SELECT r.version, avg(w.raw_reward), varSamp(w.raw_reward), count()
FROM rewards AS w FINAL
INNER JOIN (SELECT rollout_id, arrayMax(policy_versions) AS version FROM rollouts FINAL
            WHERE status = 'COMPLETE' AND notEmpty(policy_versions)
              AND arrayMin(policy_versions) = arrayMax(policy_versions)) AS r ON w.rollout_id = r.rollout_id
WHERE {VERIFIER_REWARD}
  AND w.rollout_id NOT IN ({PINNED_ROLLOUTS})
GROUP BY r.version ORDER BY r.version"""

PINNED_CALLS = """
SELECT model, ifNull(release_pin_label, '') AS label, policy_version, count(), uniqExact(rollout_id)
FROM calls FINAL WHERE release_arm = 'pinned'
GROUP BY model, label, policy_version ORDER BY model, label, policy_version"""

PINNED_REWARDS = f"""
SELECT p.model, p.label, p.version, avg(w.raw_reward), count()
FROM rewards AS w FINAL
INNER JOIN (SELECT rollout_id, any(model) AS model, any(ifNull(release_pin_label, '')) AS label,
                   max(policy_version) AS version
            FROM calls FINAL WHERE release_arm = 'pinned' GROUP BY rollout_id) AS p ON w.rollout_id = p.rollout_id
WHERE {VERIFIER_REWARD}
GROUP BY p.model, p.label, p.version"""

# Each routed call's arm against the decision log: the traffic after the decision it names (serving and
# candidate after a promote or rollback are the new ones; a pin's version from pinned_json) must give its arm
# the version that produced its tokens, under the same release id.
ARM_CHECK = """
SELECT c.release_id, c.release_arm, count() AS calls, countIf(d.found = 0) AS unknown_decision,
       countIf(d.found = 1 AND (d.release_id != c.release_id OR c.policy_version != ifNull(multiIf(
           c.release_arm = 'serving', d.serving_after, c.release_arm = 'candidate', d.candidate_after,
           JSONExtract(d.pinned_json, ifNull(c.release_pin_label, ''), 'Nullable(Int64)')), -2))) AS disagree
FROM (SELECT model, policy_version, ifNull(release_id, '') AS release_id, ifNull(release_arm, '') AS release_arm,
             release_pin_label, ifNull(release_decision_sequence, -1) AS sequence
      FROM calls FINAL WHERE release_id IS NOT NULL AND NOT scripted) AS c
LEFT JOIN (SELECT model, sequence, release_id, pinned_json, 1 AS found,
                  toNullable(if(action = 'promote', ifNull(candidate_version, serving_version), serving_version))
                      AS serving_after,
                  if(action IN ('promote', 'rollback'), NULL, candidate_version) AS candidate_after
           FROM release_decisions FINAL) AS d ON d.model = c.model AND d.sequence = c.sequence
GROUP BY c.release_id, c.release_arm ORDER BY c.release_id, c.release_arm"""

DECISIONS = """
SELECT sequence, fromUnixTimestamp64Micro(created_at_us) AS at, model, action, source, rule, serving_version,
       candidate_version, candidate_fraction, interval_low, interval_high, alpha, serving_rewards,
       candidate_rewards, reason
FROM release_decisions FINAL ORDER BY model, sequence"""

# TrainerStep v3 (migration 0015): a resume names the rollback decision it answers.
RESUMES = """
SELECT fromUnixTimestamp64Micro(s.created_at_us) AS at, s.run_id, s.policy_version_before, s.policy_version_after,
       s.resumed_from_version, s.rolled_back_version, d.sequence, s.resume_reason
FROM trainer_steps AS s FINAL
LEFT JOIN (SELECT event_id, toNullable(sequence) AS sequence FROM release_decisions FINAL) AS d
       ON d.event_id = s.resume_decision_id
WHERE s.resumed_from_version >= 0 ORDER BY s.created_at_us, s.run_id"""

Z95 = 1.959963984540054


def normal_interval(mean: float, variance: float | None, n: int) -> tuple[float, float]:
    """The mean's 95% normal interval (a description of each version's rewards, not the release's test)."""
    if n < 2 or variance is None or math.isnan(variance):
        return (math.nan, math.nan)
    half = Z95 * math.sqrt(variance / n)
    return (mean - half, mean + half)


def call_shares(rows: Sequence[tuple[Any, int, int]]) -> tuple[list[Any], dict[int, list[float]]]:
    """Per time bucket, each version's share of the calls: (buckets, version -> shares)."""
    per: dict[Any, dict[int, int]] = defaultdict(dict)
    for t, version, count in rows:
        per[t][int(version)] = int(count)
    buckets = sorted(per)
    versions = sorted({v for counts in per.values() for v in counts})
    shares = {v: [per[t].get(v, 0) / max(1, sum(per[t].values())) for t in buckets] for v in versions}
    return buckets, shares


def release_section(client: Client, png: Html, table: Html, bucket_s: int = 30) -> str:
    """HTML for the report: ``png(fig)`` and ``table(headers, rows)`` are the report's own helpers."""
    decisions = client.query(DECISIONS).result_rows
    shares_rows = client.query(CALL_SHARES.format(bucket_s=int(bucket_s))).result_rows
    rewards = client.query(REWARD_BY_VERSION).result_rows
    if not decisions:
        return '<p class="empty">no release decisions</p>'
    parts = [_timeline(shares_rows, decisions, png, bucket_s), _rewards(rewards, png, table)]
    parts.append(table(
        ["#", "time", "model", "action", "by", "rule", "serving", "candidate", "share after",
         "interval (cand − serving)", "alpha", "rewards (serving / candidate)", "reason"],
        [(d[0], d[1].strftime("%H:%M:%S") if isinstance(d[1], datetime) else d[1], d[2], d[3], d[4], d[5], d[6],
          "-" if d[7] is None else d[7], f"{d[8]:.0%}", _interval(d[9], d[10]), "-" if d[11] is None else d[11],
          f"{d[12]} / {d[13]}", d[14]) for d in decisions]))
    parts.append(_pinned(client.query(PINNED_CALLS).result_rows, client.query(PINNED_REWARDS).result_rows, table))
    parts.append(_arm_check(client.query(ARM_CHECK).result_rows, table))
    parts.append(_resumes(client.query(RESUMES).result_rows, table))
    return "".join(parts)


def _pinned(calls: Sequence[tuple[Any, ...]], rewards: Sequence[tuple[Any, ...]], table: Html) -> str:
    """Evaluation traffic per pin: served, never compared."""
    if not calls:
        return ""
    by_key = {(r[0], r[1], int(r[2])): (float(r[3]), int(r[4])) for r in rewards}
    rows = []
    for model, label, version, n_calls, rollouts in calls:
        mean, n = by_key.get((model, label, int(version)), (None, 0))
        rows.append((model, label, f"v{version}", n_calls, rollouts, n, "-" if mean is None else mean))
    return "<h3>Pinned (evaluation) traffic, per pin: not in the comparison</h3>" + table(
        ["model", "pin label", "version", "calls", "rollouts", "rewards", "mean raw reward"], rows)


def _arm_check(rows: Sequence[tuple[Any, ...]], table: Html) -> str:
    """The release arm each call was routed on, checked against the decision log."""
    if not rows:
        return ""
    disagreeing = sum(int(r[4]) for r in rows)
    verdict = ("every call's version is its arm's version in the decision it names" if not disagreeing else
               f"{disagreeing} call(s) were served another version than their arm's (an upstream that could not "
               "serve the version it was routed to)")
    return f"<h3>Release arms on the calls, against the decision log: {verdict}</h3>" + table(
        ["release", "arm", "calls", "decision not stored", "version disagrees"],
        [(str(r[0])[:12], r[1], r[2], r[3], r[4]) for r in rows])


def _resumes(rows: Sequence[tuple[Any, ...]], table: Html) -> str:
    """The trainer's answers to rollbacks: which version it went back to and what it published it as."""
    if not rows:
        return '<p class="empty">no trainer resumed after a rollback</p>'
    return "<h3>Trainer resumes after a rollback</h3>" + table(
        ["time", "trainer run", "weights before", "resumed from", "published as", "rolled back", "decision #",
         "reason"],
        [(r[0].strftime("%H:%M:%S") if isinstance(r[0], datetime) else r[0], r[1], f"v{r[2]}", f"v{r[4]}",
          f"v{r[3]}", f"v{r[5]}", "-" if r[6] is None else r[6], r[7]) for r in rows])


def _interval(low: float | None, high: float | None) -> str:
    return "-" if low is None or high is None else f"[{low:+.3f}, {high:+.3f}]"


def _timeline(rows: Sequence[tuple[Any, int, int]], decisions: Sequence[tuple[Any, ...]], png: Html,
              bucket_s: int) -> str:
    buckets, shares = call_shares(rows)
    if not buckets:
        return '<p class="empty">no calls</p>'
    fig, ax = plt.subplots(figsize=(9, 3.6))
    ax.stackplot(buckets, *shares.values(), labels=[f"v{v}" for v in shares], alpha=0.75, step="post")
    colours = {"start": "#1f5fbf", "ramp": "#888888", "promote": "#176b1f", "rollback": "#b00020", "pin": "#7a4fbf"}
    for d in decisions:
        ax.axvline(d[1], color=colours.get(d[3], "#444444"), linestyle="--", linewidth=1.2)
        ax.annotate(f"{d[3]} v{d[7] if d[7] is not None else d[6]}", (d[1], 1.0), rotation=90, fontsize=7,
                    va="top", ha="right", color=colours.get(d[3], "#444444"))
    ax.set_ylim(0, 1)
    ax.set_ylabel(f"share of calls ({bucket_s} s buckets)")
    ax.set_title("Versions in traffic, and each release decision")
    ax.legend(fontsize="small", loc="lower left")
    fig.autofmt_xdate()
    return png(fig)


def _rewards(rows: Sequence[tuple[Any, ...]], png: Html, table: Html) -> str:
    if not rows:
        return '<p class="empty">no rewards of single-version rollouts yet</p>'
    intervals = [normal_interval(float(r[1]), r[2], int(r[3])) for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    versions = [int(r[0]) for r in rows]
    means = [float(r[1]) for r in rows]
    low = [m - lo if not math.isnan(lo) else 0.0 for m, (lo, _) in zip(means, intervals, strict=True)]
    high = [hi - m if not math.isnan(hi) else 0.0 for m, (_, hi) in zip(means, intervals, strict=True)]
    ax.errorbar(versions, means, yerr=[low, high], marker="o", capsize=4, linestyle="none")
    ax.set_xticks(versions)
    ax.set_xlabel("policy version")
    ax.set_ylabel("raw reward")
    ax.set_title("Reward per version (mean, 95% interval)")
    ax.grid(alpha=0.3)
    return png(fig) + table(["policy version", "mean raw reward", "95% interval", "rollouts"],
                            [(r[0], float(r[1]), _interval(*i), r[3]) for r, i in zip(rows, intervals, strict=True)])
