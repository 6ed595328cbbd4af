"""The audit checks: the four of the design, and feedback accounting (issue 21), as SQL over the event
tables plus Python where SQL cannot reach.

(a) token traceability: every loss token lies in an OUTPUT segment whose call sampled exactly those
    ids (SQL), and the tokens conditioning it in the sample are that call's real prompt ‖ earlier
    output, with the prompt rebuilt through its delta chain and checked against its sha256 (Python).
(b) rollout traceability: every counted, complete rollout is in a group record, names its policy
    version(s) (matching its calls), and its calls and environment evidence are stored.
(c) score reviewability: every reward names existing raw scores and a reward config; every credit
    names an existing reward and a credit config; no raw score id ever had two different contents.
(d) packing preserves weight: for each credit and sample configuration, the loss weight of the
    rollout's tokens across all samples equals the credit's rollout_weight.
(e) feedback accounting: every feedback is used by exactly the rewards its config admits, or recorded
    late, unmatched or invalid; none silently dropped (sinks/feedback_audit.py). Feedback rewards name
    feedback, not raw scores, so (c) leaves them to (e).

Each check returns a CheckResult: pass/fail, how many things were checked and failed, and the failing
ids with the reason. Everything reads FINAL, so re-delivered events never count twice.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from clickhouse_connect.driver.client import Client

from processors.errors import ProcessorError
from processors.feedback.config import FeedbackRewardConfig, load_feedback_config
from schemas.local_paths import DEPLOY_CONFIG_DIR
from schemas.prompt_delta import PromptReconstructionError
from schemas.tokens import unpack_floats, unpack_ids, unpack_int32, unpack_mask
from sinks.audit_forgotten import apply_forgotten
from sinks.audit_result import CheckResult
from sinks.ddl import packed_read_sql
from sinks.feedback_audit import feedback_accounting
from sinks.feedback_store import IS_FEEDBACK_REWARD
from sinks.rows import segment_weight_sums
from sinks.sample_refs import SampleRefError, is_input_ref, rebuild_sample
from sinks.store import CallTokenCache, select_rows

# Rewards measured against a baseline (processors/baselines/derive.py: components_json "source": "baseline").
IS_BASELINE_REWARD = "JSONExtractString(components_json, 'source') = 'baseline'"
WEIGHT_REL_TOL = 1e-4
WEIGHT_ABS_TOL = 1e-6
SAMPLE_PAGE = 500


def _rows(client: Client, sql: str, parameters: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    return client.query(sql, parameters=parameters or {}).result_rows


# ---- (a) token traceability ----------------------------------------------------------------------

# Per OUTPUT segment: does the call exist, are the offsets inside its output, are the ids equal? Only
# samples whose ids are stored whole: referenced ids are rebuilt and checked in Python.
SQL_OUTPUT_SEGMENTS = """
SELECT s.sample_id, s.call_id, s.sample_start, s.call_start, s.len,
       c.found, (s.call_start + s.len) * 4 <= length(c.output_ids) AS in_range,
       s.seg_tokens = substring(c.output_ids, s.call_start * 4 + 1, s.len * 4) AS equal
FROM (
    SELECT event_id AS sample_id, seg_call_id AS call_id, seg_sample_start AS sample_start,
           seg_call_start AS call_start, seg_length AS len,
           substring(input_ids, seg_sample_start * 4 + 1, seg_length * 4) AS seg_tokens
    FROM samples FINAL
    ARRAY JOIN seg_call_id, seg_source, seg_sample_start, seg_call_start, seg_length
    WHERE seg_source = 'OUTPUT' AND empty(input_ref_call_ids)
) AS s
LEFT JOIN (SELECT call_id, any(OUTPUT_BYTES) AS output_ids, 1 AS found FROM calls FINAL GROUP BY call_id) AS c
    ON s.call_id = c.call_id
WHERE NOT (c.found = 1 AND in_range AND equal)
""".replace("OUTPUT_BYTES", packed_read_sql("output_ids"))  # calls keep ids as arrays

# Per sample: loss tokens in total vs loss tokens inside OUTPUT segments (must be equal).
SQL_MASK_COVERAGE = """
SELECT event_id, loss_tokens,
       arraySum(arrayMap(
           (src, st, ln) -> if(src = 'OUTPUT',
                               length(replaceAll(substring(loss_mask, st + 1, ln), '\\0', '')), 0),
           seg_source, seg_sample_start, seg_length)) AS covered
FROM samples FINAL
"""


def check_token_traceability(client: Client, page: int = SAMPLE_PAGE) -> CheckResult:
    result = CheckResult("token_traceability", "every loss token traces to the call that sampled it and its prompt")
    coverage = _rows(client, SQL_MASK_COVERAGE)
    result.checked = len(coverage)
    bad_samples: set[str] = set()
    for sample_id, loss_tokens, covered in coverage:
        if loss_tokens != covered:
            bad_samples.add(sample_id)
            result.fail(
                sample_id,
                "Sample",
                f"{loss_tokens} loss tokens but {covered} lie in OUTPUT segments "
                "(a loss token with no sampling call, or overlapping segments)",
            )
    for sample_id, call_id, s_start, c_start, length, found, in_range, _equal in _rows(client, SQL_OUTPUT_SEGMENTS):
        where = _output_segment(s_start, c_start, length, call_id)
        if not found:
            reason = f"{where}: call not in the calls table"
        elif not in_range:
            reason = f"{where}: offsets beyond the call's output"
        else:
            reason = f"{where}: token ids differ from the call's sampled ids"
        result.fail(sample_id, "Sample", reason)
        bad_samples.add(sample_id)
    cache = CallTokenCache(client)
    calls_checked: set[str] = set()
    for batch in _sample_pages(client, page):
        cache.fetch(
            c for row in batch for c, src in zip(row["seg_call_id"], row["seg_source"], strict=True) if src == "OUTPUT"
        )
        cache.fetch(c for row in batch for c in row["input_ref_call_ids"])
        for row in batch:
            for reason in _referenced_ids_problems(row, cache):
                result.fail(row["event_id"], "Sample", reason)
            if is_input_ref(row):
                continue  # its ids could not be rebuilt (reported above)
            for reason in _conditioning_problems(row, cache, calls_checked):
                result.fail(row["event_id"], "Sample", reason)
    result.notes.append(f"{len(calls_checked)} sampling calls' prompts rebuilt and hash-checked")
    return result


def _sample_pages(client: Client, page: int) -> Iterator[list[dict[str, Any]]]:
    """Samples in pages by sorting key (keyset pagination: no OFFSET rescans)."""
    last = ("", "")
    while True:
        rows = select_rows(
            client,
            "samples",
            "(rollout_id, event_id) > ({r:String}, {e:String})",
            {"r": last[0], "e": last[1]},
            columns="rollout_id, event_id, input_ids, loss_mask, weights, sequence_starts, "
            "seg_rollout_id, seg_call_id, seg_source, seg_sample_start, seg_call_start, "
            "seg_length, seg_weight, weight_total, input_ref_call_ids, input_length, input_sha256",
            order_by=f"rollout_id, event_id LIMIT {int(page)}",
            rebuild=False,  # referenced ids are rebuilt one sample at a time: a bad one is a failure
        )
        if not rows:
            return
        yield rows
        last = (rows[-1]["rollout_id"], rows[-1]["event_id"])


def _output_segment(s_start: int, c_start: int, length: int, call_id: str) -> str:
    return f"segment at sample[{s_start}:{s_start + length}] <- call {call_id} output[{c_start}:{c_start + length}]"


def _referenced_ids_problems(row: dict[str, Any], cache: CallTokenCache) -> list[str]:
    """For a sample whose ids are stored by reference: rebuild them (in place) and check its OUTPUT
    segments against the calls' sampled ids, as SQL_OUTPUT_SEGMENTS does for ids stored whole."""
    if not is_input_ref(row):
        return []
    try:
        rebuild_sample(row, cache.call_tokens)
    except SampleRefError as exc:
        return [f"input ids stored by reference cannot be rebuilt: {exc}"]
    ids = unpack_ids(row["input_ids"])
    problems = []
    for i, call_id in enumerate(row["seg_call_id"]):
        if row["seg_source"][i] != "OUTPUT":
            continue
        s_start, c_start, length = row["seg_sample_start"][i], row["seg_call_start"][i], row["seg_length"][i]
        where = _output_segment(s_start, c_start, length, call_id)
        if not cache.has(call_id):
            problems.append(f"{where}: call not in the calls table")
            continue
        output = cache.output_ids(call_id)
        if c_start + length > len(output):
            problems.append(f"{where}: offsets beyond the call's output")
        elif not np.array_equal(ids[s_start : s_start + length], output[c_start : c_start + length]):
            problems.append(f"{where}: token ids differ from the call's sampled ids")
    return problems


def _conditioning_problems(row: dict[str, Any], cache: CallTokenCache, calls_checked: set[str]) -> list[str]:
    """For each OUTPUT segment holding loss tokens: the tokens before it in its packed sequence must be
    the sampling call's prompt ‖ output[:call_start] (the exact prefix that conditioned them)."""
    problems = []
    ids = unpack_ids(row["input_ids"])
    mask = unpack_mask(row["loss_mask"])
    starts = unpack_int32(row["sequence_starts"]) if row["sequence_starts"] else np.zeros(1, np.int32)
    for i, call_id in enumerate(row["seg_call_id"]):
        if row["seg_source"][i] != "OUTPUT":
            continue
        s_start, c_start, length = row["seg_sample_start"][i], row["seg_call_start"][i], row["seg_length"][i]
        if not mask[s_start : s_start + length].any() or not cache.has(call_id):
            continue  # no loss here, or already reported by SQL as a missing call
        calls_checked.add(call_id)
        try:
            prompt = cache.prompt(call_id)
        except PromptReconstructionError as exc:
            problems.append(f"call {call_id}: prompt not reconstructable: {exc}")
            continue
        seq_start = int(starts[starts <= s_start].max()) if (starts <= s_start).any() else 0
        context = ids[seq_start:s_start]
        expected = np.concatenate([prompt, cache.output_ids(call_id)[:c_start]])
        if len(context) != len(expected) or not np.array_equal(context, expected):
            n = min(len(context), len(expected))
            diff = np.flatnonzero(context[:n] != expected[:n])
            at = int(diff[0]) if diff.size else n
            problems.append(
                f"segment at sample[{s_start}:{s_start + length}] <- call {call_id}: the "
                f"{len(context)} tokens conditioning it are not the call's prompt ‖ output[:{c_start}] "
                f"({len(expected)} tokens; first difference at {at})"
            )
    return problems


# ---- (b) rollout traceability --------------------------------------------------------------------

SQL_ROLLOUTS_IN_GROUPS = """
SELECT r.event_id, r.rollout_id, r.group_id, g.group_ids
FROM (SELECT event_id, rollout_id, group_id FROM rollouts FINAL WHERE status = 'COMPLETE' AND counted) AS r
LEFT JOIN (
    SELECT rollout_id, groupUniqArray(group_id) AS group_ids
    FROM groups FINAL ARRAY JOIN rollout_ids AS rollout_id
    GROUP BY rollout_id
) AS g ON r.rollout_id = g.rollout_id
"""

SQL_ROLLOUT_EVENT_IN_GROUP = """
SELECT DISTINCT r.event_id
FROM (SELECT event_id, rollout_id FROM rollouts FINAL WHERE status = 'COMPLETE' AND counted) AS r
INNER JOIN (SELECT rollout_id, rollout_event_ids FROM groups FINAL ARRAY JOIN rollout_ids AS rollout_id
            WHERE notEmpty(rollout_event_ids)) AS g ON r.rollout_id = g.rollout_id
GROUP BY r.event_id
HAVING NOT max(has(g.rollout_event_ids, r.event_id))
"""

SQL_ROLLOUT_CALLS = """
SELECT r.event_id, r.call_id, c.found, c.policy_version, has(r.policy_versions, c.policy_version)
FROM (SELECT event_id, policy_versions, call_id FROM rollouts FINAL ARRAY JOIN call_ids AS call_id
      WHERE status = 'COMPLETE' AND counted) AS r
LEFT JOIN (SELECT call_id, any(policy_version) AS policy_version, 1 AS found
           FROM calls FINAL GROUP BY call_id) AS c
    ON r.call_id = c.call_id
WHERE NOT (c.found = 1 AND has(r.policy_versions, c.policy_version))
"""

SQL_ROLLOUT_ENV = """
SELECT r.event_id, r.env_event_id
FROM (SELECT event_id, env_event_id FROM rollouts FINAL ARRAY JOIN env_event_ids AS env_event_id
      WHERE status = 'COMPLETE' AND counted) AS r
LEFT JOIN (SELECT DISTINCT event_id, 1 AS found FROM env_events) AS e ON r.env_event_id = e.event_id
WHERE e.found != 1
"""

SQL_ROLLOUT_START_FINISH = """
SELECT r.event_id, s.found, f.found, empty(r.policy_versions)
FROM (SELECT event_id, rollout_id, attempt_id, policy_versions FROM rollouts FINAL
      WHERE status = 'COMPLETE' AND counted) AS r
LEFT JOIN (SELECT DISTINCT rollout_id, attempt_id, 1 AS found FROM attempt_starts FINAL) AS s
    ON r.rollout_id = s.rollout_id AND r.attempt_id = s.attempt_id
LEFT JOIN (SELECT DISTINCT rollout_id, attempt_id, 1 AS found FROM attempt_finishes FINAL) AS f
    ON r.rollout_id = f.rollout_id AND r.attempt_id = f.attempt_id
"""


def check_rollout_traceability(client: Client) -> CheckResult:
    result = CheckResult("rollout_traceability", "every rollout names its group, policy version and env evidence")
    groups = _rows(client, SQL_ROLLOUTS_IN_GROUPS)
    result.checked = len(groups)
    for event_id, rollout_id, group_id, group_ids in groups:
        if not group_ids:
            result.fail(event_id, "CompletedRollout", f"rollout {rollout_id} is in no group record")
        elif group_id is not None and group_id not in group_ids:
            result.fail(
                event_id,
                "CompletedRollout",
                f"rollout {rollout_id} names group {group_id}, but only {sorted(group_ids)} contain it",
            )
    for (event_id,) in _rows(client, SQL_ROLLOUT_EVENT_IN_GROUP):
        result.fail(event_id, "CompletedRollout", "its group lists other attempts of the rollout, not this one")
    for event_id, found_start, found_finish, no_versions in _rows(client, SQL_ROLLOUT_START_FINISH):
        if no_versions:
            result.fail(event_id, "CompletedRollout", "names no policy version")
        if found_start != 1:
            result.fail(event_id, "CompletedRollout", "its AttemptStarted event is not stored")
        if found_finish != 1:
            result.fail(event_id, "CompletedRollout", "its AttemptFinished event is not stored")
    for event_id, call_id, found, version, _ in _rows(client, SQL_ROLLOUT_CALLS):
        reason = (
            f"call {call_id} is not in the calls table"
            if found != 1
            else f"call {call_id} ran policy version {version}, which the rollout does not name"
        )
        result.fail(event_id, "CompletedRollout", reason)
    for event_id, env_id in _rows(client, SQL_ROLLOUT_ENV):
        result.fail(event_id, "CompletedRollout", f"environment event {env_id} is not stored")
    return result


# ---- (c) score reviewability ---------------------------------------------------------------------

SQL_REWARD_SCORES_JOIN = """
SELECT w.event_id, w.rollout_id, w.reward_config_id, length(w.score_ids) AS n_scores,
       groupArrayIf(w.score_id, s.found != 1) AS missing
FROM (SELECT event_id, rollout_id, reward_config_id, score_ids,
             arrayJoin(if(empty(score_ids), [''], score_ids)) AS score_id FROM rewards FINAL
      WHERE NOT IS_FEEDBACK_REWARD AND NOT IS_BASELINE_REWARD) AS w
LEFT JOIN (SELECT DISTINCT event_id, 1 AS found FROM scores FINAL) AS s ON w.score_id = s.event_id
GROUP BY w.event_id, w.rollout_id, w.reward_config_id, w.score_ids
""".replace("IS_FEEDBACK_REWARD", IS_FEEDBACK_REWARD).replace(
    "IS_BASELINE_REWARD", IS_BASELINE_REWARD)  # feedback rewards name feedback: check (e); baseline ones below

# A reward measured against a baseline (processors/baselines/derive.py) names feedback, not scores, and the
# Baseline event it was measured against: that event must be stored.
SQL_BASELINE_REWARDS = """
SELECT w.event_id, w.rollout_id, w.baseline_id, b.found
FROM (SELECT event_id, rollout_id, JSONExtractString(components_json, 'baseline_id') AS baseline_id
      FROM rewards FINAL WHERE IS_BASELINE_REWARD) AS w
LEFT JOIN (SELECT DISTINCT event_id, 1 AS found FROM baselines FINAL) AS b ON w.baseline_id = b.event_id
""".replace("IS_BASELINE_REWARD", IS_BASELINE_REWARD)

SQL_CREDIT_REWARDS = """
SELECT c.event_id, c.reward_id, c.credit_config_id, w.found, w.rollout_id = c.rollout_id
FROM (SELECT event_id, rollout_id, reward_id, credit_config_id FROM credits FINAL) AS c
LEFT JOIN (SELECT event_id, any(rollout_id) AS rollout_id, 1 AS found
           FROM rewards FINAL GROUP BY event_id) AS w
    ON c.reward_id = w.event_id
"""

SQL_EDITED_SCORES = """
SELECT event_id, uniqExact(content_hash) AS versions, groupUniqArray(content_hash) AS hashes
FROM scores FINAL
GROUP BY event_id
HAVING versions > 1
"""


def check_score_reviewability(client: Client) -> CheckResult:
    result = CheckResult("score_reviewability", "rewards and credits name raw scores and configs; scores unchanged")
    rewards = _rows(client, SQL_REWARD_SCORES_JOIN)
    for event_id, rollout_id, config_id, n_scores, missing in rewards:
        if n_scores == 0:
            result.fail(event_id, "Reward", f"reward of rollout {rollout_id} names no raw score")
        elif missing:
            result.fail(
                event_id,
                "Reward",
                f"reward of rollout {rollout_id} names scores not stored: {sorted(missing)}",
            )
        if not config_id:
            result.fail(event_id, "Reward", "names no reward_config_id")
    measured = _rows(client, SQL_BASELINE_REWARDS)
    for event_id, rollout_id, baseline_id, found in measured:
        if found != 1:
            result.fail(event_id, "Reward", f"reward of rollout {rollout_id} was measured against baseline "
                        f"{baseline_id!r}, which is not stored")
    credits = _rows(client, SQL_CREDIT_REWARDS)
    for event_id, reward_id, config_id, found, same_rollout in credits:
        if found != 1:
            result.fail(event_id, "Credit", f"names reward {reward_id}, which is not stored")
        elif not same_rollout:
            result.fail(event_id, "Credit", f"names reward {reward_id} of another rollout")
        if not config_id:
            result.fail(event_id, "Credit", "names no credit_config_id")
    edited = _rows(client, SQL_EDITED_SCORES)
    for event_id, versions, _hashes in edited:
        result.fail(event_id, "Score", f"raw score was rewritten: {versions} different contents under one event id")
    n_scores = _rows(client, "SELECT uniqExact(event_id) FROM scores FINAL")[0][0]
    result.checked = len(rewards) + len(measured) + len(credits) + int(n_scores)
    return result


# ---- (d) packing preserves weight ----------------------------------------------------------------

SQL_SAMPLE_ROLLOUT_WEIGHTS = """
SELECT event_id, sample_config_id, credit_ids, seg_rollout_id, seg_weight, weight_total
FROM samples FINAL
"""


def check_packing_preserves_weight(client: Client, page: int = SAMPLE_PAGE) -> CheckResult:
    result = CheckResult("packing_preserves_weight", "per rollout, sample weights sum to the credit's rollout_weight")
    credits = {
        row[0]: (row[1], float(row[2]))
        for row in _rows(
            client,
            "SELECT event_id, any(rollout_id), any(rollout_weight) FROM credits FINAL GROUP BY event_id",
        )
    }
    # (credit, sample config) -> weight summed over the samples naming that credit; and which samples.
    totals: dict[tuple[str, str], float] = defaultdict(float)
    members: dict[tuple[str, str], list[str]] = defaultdict(list)
    for sample_id, config_id, credit_ids, seg_rollouts, seg_weights, weight_total in _rows(
        client, SQL_SAMPLE_ROLLOUT_WEIGHTS
    ):
        credit_of = {credits[c][0]: c for c in credit_ids if c in credits}
        for missing in (c for c in credit_ids if c not in credits):
            result.fail(sample_id, "Sample", f"names credit {missing}, which is not stored")
        per_rollout: dict[str, float] = defaultdict(float)
        for rollout_id, weight in zip(seg_rollouts, seg_weights, strict=True):
            per_rollout[rollout_id] += weight
        if not _close(sum(per_rollout.values()), weight_total):
            result.fail(
                sample_id,
                "Sample",
                f"weight {weight_total:.6g} of which only "
                f"{sum(per_rollout.values()):.6g} lies in segments (unattributed weight)",
            )
        for rollout_id, weight in per_rollout.items():
            credit_id = credit_of.get(rollout_id)
            if credit_id is None:
                if weight != 0.0:
                    result.fail(
                        sample_id,
                        "Sample",
                        f"carries weight {weight:.6g} of rollout {rollout_id} but names no credit of that rollout",
                    )
                continue
            totals[(credit_id, config_id)] += weight
            members[(credit_id, config_id)].append(sample_id)
    result.checked = len(totals)
    for (credit_id, config_id), weight in sorted(totals.items()):
        rollout_id, expected = credits[credit_id]
        if not _close(weight, expected):
            result.fail(
                credit_id,
                "Credit",
                f"rollout {rollout_id}: samples of config {config_id} carry weight {weight:.6g}, credit "
                f"says {expected:.6g} (samples: {', '.join(sorted(set(members[(credit_id, config_id)])))})",
            )
    unsampled = [c for c, (_, w) in credits.items() if w != 0.0 and not any(k[0] == c for k in totals)]
    if unsampled:
        result.notes.append(f"{len(unsampled)} credit(s) with weight have no samples yet")
    _verify_derived_weights(client, result, page)
    return result


def _verify_derived_weights(client: Client, result: CheckResult, page: int) -> None:
    """The segment weight sums the SQL used were derived at ingestion; recompute them from the bytes."""
    for batch in _sample_pages(client, page):
        for row in batch:
            weights = unpack_floats(row["weights"]).astype(np.float64)
            segments = [
                {"sample_start": s, "length": n}
                for s, n in zip(row["seg_sample_start"], row["seg_length"], strict=True)
            ]
            recomputed = segment_weight_sums(weights, segments)
            if not all(_close(a, b) for a, b in zip(recomputed, row["seg_weight"], strict=True)) or not _close(
                float(weights.sum()), row["weight_total"]
            ):
                result.fail(row["event_id"], "Sample", "stored segment weights differ from the weights bytes")


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=WEIGHT_REL_TOL, abs_tol=WEIGHT_ABS_TOL)


# ---- (e) feedback accounting (issue 21) -------------------------------------------------------------


def default_feedback_config() -> FeedbackRewardConfig | None:
    """The deployed feedback-reward config: its rewards are checked exactly, others structurally."""
    try:
        return load_feedback_config(DEPLOY_CONFIG_DIR / "feedback_reward.yaml")
    except ProcessorError:
        return None


def check_feedback_accounting(client: Client, cfg: FeedbackRewardConfig | None = None) -> CheckResult:
    """Every feedback is used by exactly the rewards its config admits, or recorded late, unmatched or
    invalid (sinks/feedback_audit.py)."""
    return feedback_accounting(client, cfg or default_feedback_config())


# ---- all five --------------------------------------------------------------------------------------

CHECKS: dict[str, Callable[[Client], CheckResult]] = {
    "token_traceability": check_token_traceability,
    "rollout_traceability": check_rollout_traceability,
    "score_reviewability": check_score_reviewability,
    "packing_preserves_weight": check_packing_preserves_weight,
    "feedback_accounting": check_feedback_accounting,
}


def run_audit(client: Client, only: list[str] | None = None) -> list[CheckResult]:
    results = [fn(client) for key, fn in CHECKS.items() if not only or key in only]
    apply_forgotten(client, results)  # a forgotten subject's events: "forgotten by request <id>"
    return results


def format_table(results: list[CheckResult], max_ids: int = 10) -> str:
    lines = [f"{'check':<26} {'result':<6} {'checked':>8} {'failed':>7}  failing ids"]
    for r in results:
        ids = r.failing_ids()
        shown = ", ".join(ids[:max_ids]) + (f" (+{len(ids) - max_ids} more)" if len(ids) > max_ids else "")
        lines.append(f"{r.key:<26} {'PASS' if r.passed else 'FAIL':<6} {r.checked:>8} {r.failed_count:>7}  {shown}")
    for r in results:
        for item in r.forgotten[:max_ids]:
            lines.append(f"  {r.key}: {item['kind']} {item['id']}: forgotten by request {item['request_id']}")
        for f in r.failures[:max_ids]:
            lines.append(f"  {r.key}: {f.kind} {f.id}: {f.reason}")
        if r.failed_count > max_ids:
            lines.append(f"  {r.key}: ... {r.failed_count - max_ids} more (use --json)")
        for note in r.notes:
            lines.append(f"  {r.key}: note: {note}")
    return "\n".join(lines)
