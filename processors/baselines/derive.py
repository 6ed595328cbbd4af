"""Records from a closed baseline window: the Baseline event, then per member a Reward measured against it,
its Credit and its Samples (the pipeline's own credit and sample stages).

The derived Reward says what it was measured against: ``group_id`` is the window's group
(``BaselineWindow.group_id``, also on the Baseline event), ``components_json`` has ``"source": "baseline"``,
``baseline_id`` (the Baseline event), ``input_reward_id`` (the feedback reward), the method and the baseline
value; ``raw_reward`` is the feedback reward's value and ``reward`` the advantage. Credits and samples carry
the same ``group_id``, so each names its baseline window. Ids are hashes of their inputs, so a replay writes
the same events.
"""

from __future__ import annotations

import json
from typing import Any

from processors.baselines.windows import BaselineWindow, Member
from processors.credit import CreditConfig, compute_credits
from processors.errors import PipelineInputError
from processors.samples import SampleConfig, build_samples
from schemas.ids import event_id

Record = dict[str, Any]
Event = tuple[str, Record]
SOURCE = "baseline"


def baseline_record(window: BaselineWindow) -> Record:
    """The window as a Baseline event (schemas/baseline.avsc)."""
    return {"event_id": window.event_id, "baseline_config_id": window.config_id, "key": window.key,
            "group_id": window.group_id, "method": window.method, "window_start_us": window.window_start_us,
            "window_end_us": window.window_end_us,
            "rollout_ids": [m.rollout_id for m in window.members],
            "rollout_event_ids": [m.rollout_event_id for m in window.members],
            "reward_ids": [m.reward_id for m in window.members], "rewards": [m.reward for m in window.members],
            "rollout_baselines": list(window.baselines), "rollout_advantages": list(window.advantages),
            "peer_reward_ids": [p.reward_id for p in window.peers], "scale": window.scale,
            "previous_id": window.before.last_window_id, "count_before": window.before.count,
            "count_after": window.after.count, "running_before": window.running_before,
            "running_after": window.running_after, "created_at_us": window.created_at_us}


def derived_reward(window: BaselineWindow, member: Member, baseline: float | None, advantage: float | None,
                   input_reward: Record, skip_zero: bool) -> Record:
    reason = None
    if advantage is None:
        reason = "no_baseline_yet: the key has no running baseline and the window is too small for a group"
    elif skip_zero and advantage == 0.0:
        reason = "zero_advantage: the reward equals its baseline"
    components = {"source": SOURCE, "baseline_id": window.event_id, "input_reward_id": member.reward_id,
                  "method": window.method, "key": window.key, "baseline": baseline}
    return {"event_id": event_id("baseline_reward", member.reward_id, window.event_id),
            "rollout_id": member.rollout_id, "group_id": window.group_id, "reward_config_id": window.config_id,
            "score_ids": list(input_reward["score_ids"]), "raw_reward": member.reward,
            "reward": 0.0 if reason else float(advantage or 0.0),
            "components_json": json.dumps(components, sort_keys=True, separators=(",", ":")),
            "filtered": reason is not None, "filter_reason": reason, "created_at_us": window.created_at_us}


def derive_window(window: BaselineWindow, rollouts: dict[str, Record], input_rewards: dict[str, Record],
                  credit_cfg: CreditConfig, sample_cfg: SampleConfig, *, skip_zero: bool = True) -> list[Event]:
    """The Baseline event, then Rewards, Credits and Samples of the window's members.

    ``rollouts`` by rollout event id and ``input_rewards`` by reward id must hold every member's."""
    missing = [m.rollout_event_id for m in window.members if m.rollout_event_id not in rollouts]
    missing += [m.reward_id for m in window.members if m.reward_id not in input_rewards]
    if missing:
        raise PipelineInputError(f"baseline window {window.event_id}: inputs not given: {missing}")
    members = list(window.members)
    ordered = [rollouts[m.rollout_event_id] for m in members]
    rewards = [derived_reward(window, m, b, a, input_rewards[m.reward_id], skip_zero)
               for m, b, a in zip(members, window.baselines, window.advantages, strict=True)]
    credits = compute_credits(ordered, rewards, credit_cfg)
    samples = build_samples({"group_id": window.group_id}, ordered, rewards, credits, credit_cfg, sample_cfg)
    return ([("Baseline", baseline_record(window))] + [("Reward", r) for r in rewards]
            + [("Credit", c) for c in credits] + [("Sample", s) for s in samples])
