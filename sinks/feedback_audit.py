"""The audit's fifth check: every feedback event is used by exactly the rewards its configuration admits,
or recorded as late, unmatched or invalid; none is silently dropped.

Per stored feedback reward of the stream (``components_json`` ``"source": "feedback"``, not a replay):
it belongs to a stored completed rollout attempt, admits only stored feedback that names that attempt
(its rollout id, one of its call or response ids, one of its calls' session ids), uses only feedback it
admits, and, when its configuration is the one given, admits exactly the feedback that configuration
admits by event time less what the stream recorded as late for that attempt, unmatched or invalid, with
the value the configuration gives them. Per stored feedback: admitted by a reward, or named by a dead letter of stage
``feedback_late``, ``feedback_join`` or ``feedback_router``. Feedback that is neither counts as pending
(a note, not a failure) while the join may still decide it: its rollout's reward is not out yet, or it
names no stored rollout and its match wait has not passed the newest window the join closed."""

from __future__ import annotations

from collections import defaultdict

from clickhouse_connect.driver.client import Client

from processors.feedback.config import FeedbackRewardConfig
from processors.feedback.join import LATE_STAGE, STAGE, FeedbackJoin, RolloutRef, reward_record, target_key
from schemas.ids import event_id
from sinks.audit_result import CheckResult
from sinks.feedback_store import (
    ROUTER_STAGE,
    components,
    load_feedback,
    load_feedback_letters,
    load_feedback_rewards,
    load_rollout_refs,
)
from sinks.rows import Record

KEY = "feedback_accounting"
TITLE = "every feedback is used by the rewards its config admits, or recorded late, unmatched or invalid"


def _names(feedback: Record, ref: RolloutRef) -> bool:
    return target_key(feedback) in ref.target_keys()


def feedback_accounting(client: Client, cfg: FeedbackRewardConfig | None = None) -> CheckResult:
    result = CheckResult(KEY, TITLE)
    feedback = {f["event_id"]: f for f in load_feedback(client)}
    refs = load_rollout_refs(client)
    rewards = [r for r in load_feedback_rewards(client) if not components(r).get("replay")]
    letters = load_feedback_letters(client)
    recorded: dict[str, set[str]] = defaultdict(set)
    late_reasons: dict[str, list[str]] = defaultdict(list)
    for letter in letters:
        if letter.feedback_id is not None:
            recorded[letter.feedback_id].add(letter.stage)
            if letter.stage == LATE_STAGE:
                late_reasons[letter.feedback_id].append(letter.reason)
    by_rollout: dict[str, list[RolloutRef]] = defaultdict(list)
    for ref in refs:
        by_rollout[ref.rollout_id].append(ref)

    used_by: dict[str, set[str]] = defaultdict(set)
    rewarded: set[str] = set()  # rollout event ids with a stream feedback reward
    for reward in rewards:
        result.checked += 1
        ref = next((r for r in by_rollout.get(reward["rollout_id"], [])
                    if reward["event_id"] == event_id("feedback_reward", r.rollout_event_id,
                                                      reward["reward_config_id"])), None)
        if ref is None:
            result.fail(reward["event_id"], "Reward", f"feedback reward of rollout {reward['rollout_id']} names no "
                        "stored completed attempt of it")
            continue
        rewarded.add(ref.rollout_event_id)
        admitted = list(components(reward).get("admitted", []))
        for fid in admitted:
            used_by[fid].add(reward["event_id"])
        unknown = [fid for fid in admitted if fid not in feedback]
        foreign = [fid for fid in admitted if fid in feedback and not _names(feedback[fid], ref)]
        unused = [fid for fid in reward["score_ids"] if fid not in admitted]
        for what, ids in (("admits feedback that is not stored", unknown),
                          ("admits feedback that names another rollout", foreign),
                          ("uses feedback it does not admit", unused)):
            if ids:
                result.fail(reward["event_id"], "Reward", f"feedback reward of rollout {ref.rollout_id}: {what}: "
                            f"{sorted(ids)}")
        if cfg is not None and reward["reward_config_id"] == cfg.id:
            refused = {fid for fid, stages in recorded.items() if stages & {STAGE, ROUTER_STAGE}}
            _check_exact(result, reward, ref, admitted, feedback, late_reasons, refused, cfg)

    newest_window_end = max((int(r["created_at_us"]) for r in rewards), default=None)
    wait_cfg = cfg or FeedbackRewardConfig()
    pending = 0
    for fid, item in feedback.items():
        result.checked += 1
        if used_by.get(fid) or recorded.get(fid):
            continue
        named = [ref for ref in refs if _names(item, ref)]
        if any(ref.rollout_event_id in rewarded for ref in named):
            result.fail(fid, "Feedback", "names a rollout whose feedback reward is out, but no reward admits it and "
                        "it is not recorded late: silently dropped")
        elif not named and newest_window_end is not None and (
                item["event_time_us"] + wait_cfg.match_wait_us + wait_cfg.lag_us < newest_window_end):
            result.fail(fid, "Feedback", f"names no stored rollout, its match wait ({wait_cfg.match_wait_s:g}s) is "
                        "over, and it is not recorded unmatched: silently dropped")
        else:
            pending += 1
    if pending:
        result.notes.append(f"{pending} feedback event(s) still pending (their rollout's window is open or their "
                            "match wait is not over)")
    return result


def _check_exact(result: CheckResult, reward: Record, ref: RolloutRef, admitted: list[str],
                 feedback: dict[str, Record], late_reasons: dict[str, list[str]], refused: set[str],
                 cfg: FeedbackRewardConfig) -> None:
    """The reward admits what its configuration admits by event time, less what was recorded late for
    this attempt or recorded unmatched (it waited out its match wait before the rollout came) or invalid,
    and has the value the configuration gives that feedback."""
    eligible = {fid for fid, f in feedback.items()
                if _names(f, ref) and f["event_time_us"] <= ref.closed_at_us + cfg.wait_us(f["kind"])}
    late_here = {fid for fid, reasons in late_reasons.items()
                 if any(ref.rollout_event_id in reason for reason in reasons)}
    expected_ids = eligible - late_here - refused
    if set(admitted) != expected_ids:
        missing, extra = sorted(expected_ids - set(admitted)), sorted(set(admitted) - expected_ids)
        result.fail(reward["event_id"], "Reward", f"feedback reward of rollout {ref.rollout_id}: its config admits "
                    f"{len(expected_ids)} feedback; not admitted and not recorded late: {missing}; admitted "
                    f"though its config does not admit them: {extra}")
        return
    expected = reward_record(FeedbackJoin(cfg).reward_of(ref, [feedback[fid] for fid in admitted]))
    fields = ("reward", "filtered", "score_ids")
    if any(expected[k] != reward[k] for k in fields):
        result.fail(reward["event_id"], "Reward", f"feedback reward of rollout {ref.rollout_id}: "
                    f"{ {k: reward[k] for k in fields} } but its config gives { {k: expected[k] for k in fields} }")
