"""Calls whose output the family's parser could not parse (processors/parse_failures.py): the assembler carries
the gateway's parse errors onto the rollout, and the credit configuration's ``parse_failures`` policy decides
whether their tokens train (keep, the default), leave the loss (mask) or take the rollout out of training (drop),
with credit and samples agreeing so a rollout's loss weight is still its credit's."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from processors.config import load_config
from processors.credit import CreditConfig, compute_credits
from processors.errors import ConfigError
from processors.parse_failures import parse_failed_call_ids, recorded_parse_failures, trained_calls
from processors.rewards import RewardConfig, compute_rewards
from processors.samples import SampleConfig, build_samples, weight_by_rollout
from schemas.codec import get_codec
from schemas.ids import content_hash
from testkit.stages import AttemptSpec, attempt_events, constant_scores, full_group, growing_turns

from .test_assembler import _feed
from .test_sample_building import check_provenance

REWARD = RewardConfig(metrics=[{"name": "m", "verifier": "v"}], normalize={"method": "none"},
                      filters={"zero_variance": False})
BROKEN = ["tool call 0: invalid_json: '<tool_call>\\n{\"name\": \"lookup\", \"arguments\": {\"key\": '"]


def _rollout(rid: str, failed: dict[int, list[str]], n: int = 4, seed: int = 0) -> dict[str, Any]:
    """A rollout assembled from call records whose sampling extras name these parse errors (as the gateway
    writes them, producers/gateway/service.py)."""
    from processors.assembler import RolloutAssembly

    rng = np.random.default_rng(seed)
    events = attempt_events(AttemptSpec(rid, "a1", growing_turns(rng, n, 20, 4, 6, vocab=700)))
    for name, record in events:
        if name == "CallRecord" and record["call_index"] in failed:
            extra = {"stop_token_ids": [2], "parse_errors": failed[record["call_index"]]}
            record["sampling"] = dict(record["sampling"], extra_json=json.dumps(extra))
    (rollout,) = _feed(RolloutAssembly(rid), events)
    return rollout


def _derive(rollouts: list[dict[str, Any]], credit: CreditConfig, sample: SampleConfig = SampleConfig()) -> Any:
    group = full_group(rollouts)
    rewards = compute_rewards(group, rollouts, constant_scores(group, rollouts, [1.0] * len(rollouts)), REWARD)
    credits = compute_credits(rollouts, rewards, credit)
    samples = build_samples(group, rollouts, rewards, credits, credit, sample)
    for s in samples:
        get_codec().encode("Sample", s)
    return rewards, credits, samples


def _trained_call_ids(samples: list[dict[str, Any]]) -> list[str]:
    return sorted(seg["call_id"] for s in samples for seg in s["segments"] if seg["source"] == "OUTPUT")


def test_the_assembler_carries_the_gateways_parse_errors_onto_the_rollout() -> None:
    rollout = _rollout("r1", {1: BROKEN * 2})
    assert [c["parse_failures"] for c in rollout["calls"]] == [0, 2, 0, 0]
    assert parse_failed_call_ids(rollout) == [rollout["calls"][1]["call_id"]]
    get_codec().encode("CompletedRollout", rollout)  # valid against the contract


def test_parse_errors_are_read_from_the_call_records_sampling_extras() -> None:
    def call(extra: str) -> dict[str, Any]:
        return {"sampling": {"extra_json": extra}}

    assert recorded_parse_failures(call('{"parse_errors": ["a", "b", "c"]}')) == 3
    assert recorded_parse_failures(call('{"stop_token_ids": [2]}')) == 0
    assert recorded_parse_failures(call('parse_errors, not JSON')) == 0  # nothing the gateway wrote
    assert recorded_parse_failures(call('["parse_errors"]')) == 0
    assert recorded_parse_failures({"sampling": {}}) == 0


@pytest.mark.parametrize("merge", [False, True])
def test_keep_trains_every_call_mask_leaves_the_failed_call_out_drop_the_whole_rollout(merge: bool) -> None:
    failing, clean = _rollout("r1", {2: BROKEN}), _rollout("r2", {}, seed=1)
    by_id = {"r1": failing, "r2": clean}
    ids = {r["rollout_id"]: [c["call_id"] for c in r["calls"]] for r in (failing, clean)}
    cfg = SampleConfig(merge=merge)
    outcomes = {}
    for policy in ("keep", "mask", "drop"):
        credit = CreditConfig(parse_failures=policy)
        rewards, credits, samples = _derive([failing, clean], credit, cfg)
        for s in samples:
            check_provenance(s, by_id)
        per_rollout: dict[str, float] = {}
        for s in samples:  # the weight audit's check: samples carry exactly the credit's weight
            for rid, w in weight_by_rollout(s).items():
                per_rollout[rid] = per_rollout.get(rid, 0.0) + w
        for c in credits:
            assert per_rollout.get(c["rollout_id"], 0.0) == pytest.approx(c["rollout_weight"], rel=1e-6)
        assert [r["reward"] for r in rewards] == [1.0, 1.0]  # the reward is as scored whatever the policy
        outcomes[policy] = (_trained_call_ids(samples), [c["rollout_weight"] for c in credits],
                            [c["sampled_tokens"] for c in credits])
    assert outcomes["keep"] == (sorted(ids["r1"] + ids["r2"]), [1.0, 1.0], [16, 16])
    masked = [c for i, c in enumerate(ids["r1"]) if i != 2]
    assert outcomes["mask"] == (sorted(masked + ids["r2"]), [1.0, 1.0], [12, 16])
    assert outcomes["drop"] == (sorted(ids["r2"]), [0.0, 1.0], [0, 16])


def test_merged_chains_break_at_a_masked_call() -> None:
    rollout = _rollout("r1", {1: BROKEN})
    _, _, samples = _derive([rollout], CreditConfig(parse_failures="mask"), SampleConfig(merge=True))
    chains = [[seg["call_index"] for seg in s["segments"] if seg["source"] == "OUTPUT"] for s in samples]
    assert chains == [[0], [2, 3]]


def test_rollouts_assembled_before_the_field_and_scripted_failures_count_as_parsed() -> None:
    rollout = _rollout("r1", {1: BROKEN})
    old = dict(rollout, calls=[{k: v for k, v in c.items() if k != "parse_failures"} for c in rollout["calls"]])
    unknown = dict(rollout, calls=[dict(c, parse_failures=None) for c in rollout["calls"]])
    for r in (old, unknown):
        assert trained_calls(r, "drop") == trained_calls(r, "mask") == [True] * 4
    # A scripted output (a test driving a harness) never trains; its failure is not the model's: drop keeps the rest.
    scripted = dict(rollout, calls=[dict(c, scripted=c["call_index"] == 1) for c in rollout["calls"]])
    assert trained_calls(scripted, "drop") == trained_calls(scripted, "keep") == [True, False, True, True]
    with pytest.raises(ValueError, match="unknown parse failure policy"):
        trained_calls(rollout, "ignore")  # type: ignore[arg-type]


def test_the_default_policy_keeps_the_credit_config_id_stored_records_name() -> None:
    """Credit configs written before the policy existed meant keep: their ids (on stored credits and samples)
    must not change; any other policy is a new configuration with an id of its own."""
    default = CreditConfig()
    before = {k: v for k, v in default.model_dump(mode="json").items() if k != "parse_failures"}
    assert default.parse_failures == "keep" and default.id == content_hash(before)
    assert load_config(CreditConfig, "level: call\nparse_failures: keep\n").id == CreditConfig(level="call").id
    ids = {CreditConfig(parse_failures=p).id for p in ("keep", "mask", "drop")}
    assert len(ids) == 3
    with pytest.raises(ConfigError, match="parse_failures"):
        load_config(CreditConfig, {"parse_failures": "ignore"})
