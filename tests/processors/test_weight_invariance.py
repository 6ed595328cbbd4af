"""Property: splitting, merging or packing never changes which sampled tokens are in the loss, nor
their weight, advantage or logprob — so every rollout's total weight is the same in every layout."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.call_tokens import is_sampled
from processors.credit import CreditConfig, compute_credits
from processors.rewards import RewardConfig, compute_rewards
from processors.samples import SampleConfig, build_samples, weight_by_rollout
from schemas.tokens import unpack_floats
from testkit.stages import AttemptSpec, Turn, assemble, constant_scores, full_group

call_plan = st.tuples(st.integers(0, 7), st.integers(0, 4), st.booleans(), st.booleans(), st.integers(0, 2))
rollout_plan = st.lists(call_plan, min_size=1, max_size=6)

credit_configs = st.builds(
    CreditConfig, level=st.sampled_from(["rollout", "call", "token"]),
    call_discount=st.sampled_from([1.0, 0.9, 0.5]), token_discount=st.sampled_from([1.0, 0.99, 0.7]),
    weighting=st.sampled_from(["token_mean", "call_mean", "token_sum"]),
    rollout_weight=st.sampled_from([1.0, 0.25, 3.0]))

LAYOUTS = [SampleConfig(), SampleConfig(merge=True), SampleConfig(merge=True, max_sample_tokens=40),
           SampleConfig(pack={"enabled": True, "max_tokens": 64}),
           SampleConfig(merge=True, pack={"enabled": True, "max_tokens": 96}),
           SampleConfig(pack={"enabled": True, "max_tokens": 7})]

REWARD = RewardConfig(metrics=[{"name": "m", "verifier": "v"}], filters={"zero_variance": False},
                      normalize={"method": "none"})


def build_rollout(rid: str, plan: list[tuple[int, int, bool, bool, int]], seed: int) -> dict:
    """Each call: (output length, tool-result length, history rewritten?, failed?, policy version step)."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, 300, 5, dtype=np.uint32)
    turns, version = [], 0
    for out_len, tool_len, rewrite, failed, step in plan:
        if rewrite and len(prompt):
            prompt = prompt.copy()
            prompt[0] += 1  # the template changed earlier context: the prefix breaks here
        output = rng.integers(0, 300, 0 if failed else out_len, dtype=np.uint32)
        version += step
        turns.append(Turn(prompt, output, status="ERROR" if failed else "OK", policy_version=version,
                          logprobs=-rng.random(len(output), dtype=np.float32)))
        prompt = np.concatenate([prompt, output, rng.integers(0, 300, tool_len, dtype=np.uint32)])
    return assemble(AttemptSpec(rid, "a1", turns))


def token_table(samples: list[dict]) -> dict[tuple[str, int], tuple[float, float, float]]:
    """(call id, output offset) -> (weight, advantage, logprob) of every token in the loss."""
    table: dict[tuple[str, int], tuple[float, float, float]] = {}
    for s in samples:
        w, adv, lp = (unpack_floats(s[k]) for k in ("weights", "advantages", "rollout_logprobs"))
        for seg in s["segments"]:
            if seg["source"] != "OUTPUT":
                continue
            for t in range(seg["length"]):
                key = (seg["call_id"], seg["call_start"] + t)
                assert key not in table, f"token {key} is in the loss twice"
                i = seg["sample_start"] + t
                table[key] = (float(w[i]), float(adv[i]), float(lp[i]))
    return table


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans=st.lists(rollout_plan, min_size=1, max_size=3), credit=credit_configs,
       values=st.lists(st.floats(-3, 3, allow_nan=False), min_size=3, max_size=3), seed=st.integers(0, 999))
def test_total_weight_of_every_rollout_is_identical_split_merged_or_packed(
        plans: list[list[tuple[int, int, bool, bool, int]]], credit: CreditConfig, values: list[float],
        seed: int) -> None:
    rollouts = [build_rollout(f"r{i}", plan, seed + i) for i, plan in enumerate(plans)]
    group = full_group(rollouts)
    scores = constant_scores(group, rollouts, values[:len(rollouts)])
    rewards = compute_rewards(group, rollouts, scores, REWARD)
    credits = compute_credits(rollouts, rewards, credit)
    expected_tokens = {(c["call_id"], t) for r in rollouts for c in r["calls"] if is_sampled(c)
                       for t in range(len(c["output_ids"]) // 4)}

    tables, totals = [], []
    for layout in LAYOUTS:
        samples = build_samples(group, rollouts, rewards, credits, credit, layout)
        table = token_table(samples)
        assert set(table) == expected_tokens  # every sampled token exactly once
        tables.append(table)
        total: dict[str, float] = {}
        for s in samples:
            for rid, w in weight_by_rollout(s).items():
                total[rid] = total.get(rid, 0.0) + w
        totals.append(total)
    assert all(t == tables[0] for t in tables[1:])  # same weight / advantage / logprob per token
    for c in credits:
        sums = [t.get(c["rollout_id"], 0.0) for t in totals]
        assert all(math.isclose(x, sums[0], rel_tol=1e-12, abs_tol=1e-12) for x in sums)
        assert math.isclose(sums[0], c["rollout_weight"], rel_tol=1e-5, abs_tol=1e-9)
