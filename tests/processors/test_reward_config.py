"""Rewards: versioned config (content-hash ids, clear validation errors), filters, normalization."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from processors.config import load_config
from processors.errors import ConfigError, PipelineInputError
from processors.rewards import RewardConfig, compute_rewards

T0 = 1_700_000_000_000_000


def rollout(rid: str, tokens: int = 10) -> dict[str, Any]:
    return {"event_id": f"ev-{rid}", "rollout_id": rid, "calls": [
        {"status": "OK", "output_ids": b"\x01\x00\x00\x00" * tokens}, {"status": "ERROR", "output_ids": b""}]}


def group(*rids: str, status: str = "FULL") -> dict[str, Any]:
    return {"event_id": "g-ev", "group_id": "g", "status": status, "created_at_us": T0,
            "rollout_event_ids": [f"ev-{r}" for r in rids]}


def score(rid: str, value: Any, *, name: str = "v", status: str = "OK", version: str = "1") -> dict[str, Any]:
    return {"event_id": f"s-{name}-{version}-{rid}", "rollout_id": rid, "rollout_event_id": f"ev-{rid}",
            "group_id": "g", "verifier_name": name, "verifier_version": version, "scope": "ROLLOUT",
            "status": status, "raw_json": json.dumps(value), "error": None if status == "OK" else "boom",
            "duration_ms": 0.0, "created_at_us": T0}


def cfg(**kw: Any) -> RewardConfig:
    base: dict[str, Any] = {"metrics": [{"name": "m", "verifier": "v", "path": "score"}],
                            "filters": {"min_group_size": 1}}
    base.update(kw)
    return RewardConfig.model_validate(base)


def rewards_for(values: list[float], config: RewardConfig, status: str = "FULL") -> list[dict[str, Any]]:
    rids = [f"r{i}" for i in range(len(values))]
    return compute_rewards(group(*rids, status=status), [rollout(r) for r in rids],
                           [score(r, {"score": v}) for r, v in zip(rids, values, strict=True)], config)


def test_grpo_rloo_and_none() -> None:
    values = [1.0, 0.0, 0.0, 1.0]
    grpo = [r["reward"] for r in rewards_for(values, cfg())]
    assert grpo == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    unscaled = [r["reward"] for r in rewards_for(values, cfg(normalize={"scale_by_std": False}))]
    assert unscaled == [0.5, -0.5, -0.5, 0.5]
    rloo = [r["reward"] for r in rewards_for([3.0, 0.0, 0.0], cfg(normalize={"method": "rloo"}))]
    assert rloo == [3.0, -1.5, -1.5]
    none = rewards_for([3.0, 0.0], cfg(normalize={"method": "none"}))
    assert [r["reward"] for r in none] == [3.0, 0.0] and [r["raw_reward"] for r in none] == [3.0, 0.0]
    components = json.loads(none[0]["components_json"])
    assert components["metrics"] == {"m": 3.0} and components["group"]["n"] == 2


def test_zero_variance_groups_are_filtered_with_the_reason() -> None:
    out = rewards_for([1.0, 1.0, 1.0], cfg())
    assert all(r["filtered"] and r["filter_reason"].startswith("zero_variance") for r in out)
    assert not any(r["filtered"] for r in rewards_for([1.0, 1.0], cfg(filters={"zero_variance": False})))


def test_group_filters_late_partial_and_small() -> None:
    late = rewards_for([1.0, 0.0], cfg(), status="LATE")
    assert all(r["filter_reason"].startswith("late") for r in late)
    partial = rewards_for([1.0, 0.0], cfg(filters={"partial_groups": "filter"}), status="PARTIAL")
    assert all(r["filter_reason"] == "partial_group" for r in partial)
    small = rewards_for([1.0, 0.0], cfg(filters={"min_group_size": 3}))
    assert all(r["filter_reason"].startswith("group_too_small") for r in small)
    assert not any(r["filtered"] for r in rewards_for([1.0, 0.0], cfg(), status="PARTIAL"))


def test_failed_scores_filter_the_rollout_or_use_the_default() -> None:
    rids = ["a", "b", "c"]
    scores = [score("a", {"score": 1.0}), score("b", None, status="TIMEOUT"), score("c", {"score": 0.0})]
    out = compute_rewards(group(*rids), [rollout(r) for r in rids], scores, cfg())
    assert out[1]["filtered"] and out[1]["filter_reason"] == "score_error: verifier v TIMEOUT"
    assert out[1]["score_ids"] == ["s-v-1-b"]  # still names the score it looked at
    assert [r["reward"] for r in (out[0], out[2])] == pytest.approx([1.0, -1.0], abs=1e-5)  # stats skip b
    lenient = cfg(metrics=[{"name": "m", "verifier": "v", "path": "score", "on_error": "default",
                            "default": 0.5}])
    out = compute_rewards(group(*rids), [rollout(r) for r in rids], scores, lenient)
    assert not any(r["filtered"] for r in out)
    assert json.loads(out[1]["components_json"])["defaults_used"] == ["m"]
    missing = compute_rewards(group("a"), [rollout("a")], [], cfg())
    assert missing[0]["filter_reason"] == "score_error: no score from verifier v"


def test_combine_clip_length_penalty_and_bool_metrics() -> None:
    config = cfg(metrics=[{"name": "ok", "verifier": "v", "path": "correct", "weight": 2.0},
                          {"name": "q", "verifier": "w", "weight": 0.5}],
                 normalize={"method": "none"}, clip=[-1.0, 2.0],
                 length_penalty={"coef": 0.5, "free_tokens": 5, "span_tokens": 10})
    rids = ["a", "b"]
    scores = [score("a", {"correct": True}), score("a", 4.0, name="w"),
              score("b", {"correct": False}), score("b", -8.0, name="w")]
    out = compute_rewards(group(*rids), [rollout("a", tokens=10), rollout("b", tokens=40)], scores, config)
    assert out[0]["raw_reward"] == 4.0 and out[0]["reward"] == 2.0  # 4 - 0.25 penalty, clipped to 2
    assert out[1]["raw_reward"] == -4.0 and out[1]["reward"] == -1.0
    assert json.loads(out[0]["components_json"])["length_penalty"] == 0.25
    assert out[0]["score_ids"] == sorted(["s-v-1-a", "s-w-1-a"])


def test_raw_scores_are_never_modified() -> None:
    rids = ["a", "b"]
    scores = [score("a", {"score": 1.0}), score("b", {"score": 0.0})]
    before = copy.deepcopy(scores)
    compute_rewards(group(*rids), [rollout(r) for r in rids], scores, cfg())
    assert scores == before


def test_ambiguous_verifier_versions_need_a_pin() -> None:
    scores = [score("a", {"score": 1.0}, version="1"), score("a", {"score": 0.0}, version="2+oabc")]
    with pytest.raises(PipelineInputError, match="pin the metric's version"):
        compute_rewards(group("a"), [rollout("a")], scores, cfg())
    pinned = cfg(metrics=[{"name": "m", "verifier": "v", "path": "score", "version": "2"}],
                 filters={"zero_variance": False}, normalize={"method": "none"})
    (out,) = compute_rewards(group("a"), [rollout("a")], scores, pinned)
    assert out["raw_reward"] == 0.0 and out["score_ids"] == ["s-v-2+oabc-a"]


def test_config_id_is_a_content_hash_of_the_normalized_content(tmp_path: Any) -> None:
    shipped = load_config(RewardConfig, "deploy/config/reward.yaml")
    reordered = yaml.safe_load(Path("deploy/config/reward.yaml").read_text())
    reordered = dict(reversed(list(reordered.items())))
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(reordered, sort_keys=False, default_flow_style=True))
    assert load_config(RewardConfig, path).id == shipped.id
    minimal = RewardConfig(metrics=[{"name": "m", "verifier": "v"}])
    spelled = RewardConfig(metrics=[{"name": "m", "verifier": "v", "path": "", "weight": 1.0}],
                           normalize={"method": "grpo"})
    assert minimal.id == spelled.id
    assert RewardConfig(metrics=[{"name": "m", "verifier": "v", "weight": 2.0}]).id != minimal.id
    assert len(minimal.id) == 16


@pytest.mark.parametrize(("text", "message"), [
    ("metrics: []", "metrics: List should have at least 1 item"),
    ("metrics: [{name: m, verifier: v}]\nnormalise: {}", "normalise: Extra inputs are not permitted"),
    ("metrics: [{name: m, verifier: v}, {name: m, verifier: w}]", "metric names must be unique"),
    ("metrics: [{name: m, verifier: v}]\nclip: [1, -1]", "low < high"),
    ("metrics: [{name: m, verifier: v}]\nnormalize: {method: zscore}", "normalize.method"),
    ("metrics: [{name: m, verifier: v, weight: heavy}]", "metrics.0.weight"),
    ("- a\n- b", "expected a mapping"),
    ("metrics: [", "not valid YAML"),
])
def test_invalid_configs_give_clear_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(RewardConfig, text + "\n")
    assert message in str(info.value)


def test_missing_file_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(RewardConfig, "deploy/config/nope.yaml")


def test_grpo_with_sample_std() -> None:
    out = rewards_for([2.0, 0.0], cfg(normalize={"std_ddof": 1, "eps": 0.0}))
    assert [r["reward"] for r in out] == pytest.approx([1 / math.sqrt(2), -1 / math.sqrt(2)])
