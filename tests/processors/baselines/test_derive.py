"""From a closed baseline window to events (processors/baselines/derive.py): the Baseline record, a reward per
member naming the baseline and the feedback reward it measured, credits and samples carrying the window's
group id and each rollout's whole weight; no baseline or a zero advantage gets no credit and no samples."""

from __future__ import annotations

import orjson
import pytest

from processors.baselines.config import BaselineConfig
from processors.baselines.derive import derive_window
from processors.baselines.windows import KeyBaselines, Member
from processors.credit import CreditConfig
from processors.errors import PipelineInputError
from processors.grouper import GroupingConfig
from processors.pipeline import StageConfigs
from processors.samples import SampleConfig, weight_by_rollout
from reliability.pipeline import derive_outputs
from schemas.codec import get_codec
from schemas.local_paths import DEPLOY_CONFIG_DIR

from .organic import T0_US, S, organic_rollout


def test_a_window_becomes_a_baseline_rewards_credits_and_samples() -> None:
    stages = StageConfigs.load(DEPLOY_CONFIG_DIR / "reward.yaml", DEPLOY_CONFIG_DIR / "credit.yaml",
                               DEPLOY_CONFIG_DIR / "sample.yaml")
    events = [e for k in range(3) for e in organic_rollout(f"d{k}", "Fix it", T0_US + (k + 1) * S, seed=k, calls=3)]
    rollouts = list(derive_outputs(events, GroupingConfig(), stages, [])["CompletedRollout"].values())
    by_event = {r["event_id"]: r for r in rollouts}
    rewards = {f"w{k}": {"event_id": f"w{k}", "score_ids": [f"feedback-{k}"]} for k in range(3)}
    members = [Member(r["event_id"], r["rollout_id"], f"w{k}", [1.0, 0.5, 0.5][k], r["created_at_us"])
               for k, r in enumerate(sorted(rollouts, key=lambda r: r["created_at_us"]))]
    cfg = BaselineConfig(window={"size_s": 10}, min_group_size=2, group={"baseline": "mean"})
    state = KeyBaselines(cfg, "cluster:x")
    for member in members:
        state.add(member)
    (window,) = state.tick(T0_US + 100 * S)
    credit_cfg = CreditConfig(weighting="token_mean", rollout_weight=2.0)
    out = derive_window(window, by_event, rewards, credit_cfg, SampleConfig())
    names = [name for name, _ in out]
    assert names[0] == "Baseline" and names.count("Reward") == 3
    baseline = out[0][1]
    get_codec().encode("Baseline", baseline)  # fits its schema
    assert baseline["rollout_advantages"] == pytest.approx([1 / 3, -1 / 6, -1 / 6])
    reward_records = [rec for name, rec in out if name == "Reward"]
    assert all(r["group_id"] == baseline["group_id"] and r["reward_config_id"] == cfg.id for r in reward_records)
    components = orjson.loads(reward_records[0]["components_json"])
    assert components == {"source": "baseline", "baseline_id": baseline["event_id"], "input_reward_id": "w0",
                          "method": "GROUP", "key": "cluster:x", "baseline": pytest.approx(2 / 3)}
    assert reward_records[0]["score_ids"] == ["feedback-0"] and reward_records[0]["raw_reward"] == 1.0
    credits = [rec for name, rec in out if name == "Credit"]
    assert len(credits) == 3 and {c["group_id"] for c in credits} == {baseline["group_id"]}
    samples = [rec for name, rec in out if name == "Sample"]
    assert samples and all(s["group_ids"] == [baseline["group_id"]] for s in samples)
    totals: dict[str, float] = {}
    for sample in samples:
        for rollout_id, weight in weight_by_rollout(sample).items():
            totals[rollout_id] = totals.get(rollout_id, 0.0) + weight
    assert totals == pytest.approx({r["rollout_id"]: 2.0 for r in rollouts})  # each rollout's whole weight

    # A zero advantage (rewards equal to their baseline) and no baseline at all: recorded, not trained on.
    flat = KeyBaselines(BaselineConfig(window={"size_s": 10}, min_group_size=2), "cluster:y")
    for member in members[1:]:
        flat.add(member)
    (zero,) = flat.tick(T0_US + 100 * S)
    zero_out = derive_window(zero, by_event, rewards, credit_cfg, SampleConfig())
    assert [name for name, _ in zero_out] == ["Baseline", "Reward", "Reward"]
    assert {r["filter_reason"].split(":")[0] for name, r in zero_out if name == "Reward"} == {"zero_advantage"}
    lonely = KeyBaselines(BaselineConfig(window={"size_s": 10}, min_group_size=2), "cluster:z")
    lonely.add(members[0])
    (nothing,) = lonely.tick(T0_US + 100 * S)
    assert [r["filter_reason"].split(":")[0] for name, r in derive_window(nothing, by_event, rewards, credit_cfg,
                                                                            SampleConfig()) if name == "Reward"] == [
        "no_baseline_yet"]
    with pytest.raises(PipelineInputError, match="inputs not given"):
        derive_window(window, by_event, {}, credit_cfg, SampleConfig())
