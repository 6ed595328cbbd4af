"""Samples: per-call split, merging only on an exact token prefix, packing, provenance."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from processors.call_tokens import rollout_call_tokens
from processors.credit import CreditConfig, compute_credits
from processors.rewards import RewardConfig, compute_rewards
from processors.samples import SampleConfig, build_samples, weight_by_rollout
from schemas.codec import get_codec
from schemas.tokens import unpack_floats, unpack_ids, unpack_int32, unpack_mask
from testkit.stages import AttemptSpec, Turn, assemble, constant_scores, full_group, growing_turns

REWARD = RewardConfig(metrics=[{"name": "m", "verifier": "v"}], normalize={"method": "none"},
                      filters={"zero_variance": False})
CREDIT = CreditConfig()


def samples_for(rollouts: list[dict], cfg: SampleConfig, credit: CreditConfig = CREDIT,
                values: list[float] | None = None) -> list[dict]:
    group = full_group(rollouts)
    scores = constant_scores(group, rollouts, values or [1.0] * len(rollouts))
    rewards = compute_rewards(group, rollouts, scores, REWARD)
    credits = compute_credits(rollouts, rewards, credit)
    samples = build_samples(group, rollouts, rewards, credits, credit, cfg)
    for s in samples:
        get_codec().encode("Sample", s)  # every sample is valid against the schema
    return samples


def arrays(sample: dict) -> dict[str, np.ndarray]:
    return {"ids": unpack_ids(sample["input_ids"]), "mask": unpack_mask(sample["loss_mask"]),
            "lp": unpack_floats(sample["rollout_logprobs"]), "adv": unpack_floats(sample["advantages"]),
            "w": unpack_floats(sample["weights"]), "starts": unpack_int32(sample["sequence_starts"])}


def check_provenance(sample: dict, rollouts: dict[str, dict]) -> None:
    """Every segment's tokens are exactly the named call's prompt/output tokens at the named offsets."""
    a = arrays(sample)
    covered = np.zeros(len(a["ids"]), dtype=int)
    for seg in sample["segments"]:
        rollout = rollouts[seg["rollout_id"]]
        tok = next(t for t in rollout_call_tokens(rollout) if t.call_id == seg["call_id"])
        source = tok.prompt if seg["source"] == "PROMPT" else tok.output
        lo, n = seg["sample_start"], seg["length"]
        assert np.array_equal(a["ids"][lo:lo + n], source[seg["call_start"]:seg["call_start"] + n])
        assert a["mask"][lo:lo + n].all() == (seg["source"] == "OUTPUT")
        if seg["source"] == "OUTPUT":
            call = next(c for c in rollout["calls"] if c["call_id"] == seg["call_id"])
            assert np.array_equal(a["lp"][lo:lo + n], unpack_floats(call["output_logprobs"]))
        covered[lo:lo + n] += 1
    assert (covered == 1).all()  # segments tile the sample exactly
    assert np.isnan(a["lp"][a["mask"] == 0]).all() and not np.isnan(a["lp"][a["mask"] == 1]).any()
    assert (a["w"][a["mask"] == 0] == 0).all() and (a["adv"][a["mask"] == 0] == 0).all()


def _rollout(rid: str, n: int = 3, seed: int = 0, **kw: Any) -> dict:
    rng = np.random.default_rng(seed)
    return assemble(AttemptSpec(rid, "a1", growing_turns(rng, n, 20, 4, 6, vocab=700), **kw))


def test_split_gives_one_sample_per_successful_call() -> None:
    r = _rollout("r1")
    samples = samples_for([r], SampleConfig())
    assert [s["kind"] for s in samples] == ["CALL"] * 3
    toks = rollout_call_tokens(r)
    for s, tok in zip(samples, toks, strict=True):
        a = arrays(s)
        assert np.array_equal(a["ids"], np.concatenate([tok.prompt, tok.output]))
        assert a["mask"].sum() == len(tok.output) and a["mask"][-len(tok.output):].all()
        assert a["starts"].tolist() == [0]
        check_provenance(s, {"r1": r})
        assert s["rollout_ids"] == ["r1"] and s["group_ids"] == ["g"] and len(s["credit_ids"]) == 1
        assert len(s["reward_ids"]) == 1 and len(s["score_ids"]) == 1


def test_a_scripted_output_is_never_trained_on() -> None:
    """A call whose output the engine was scripted to emit (a test driving a harness) gives no sample and
    no loss weight; the rollout's sampled calls train as before."""
    r = _rollout("r1")
    r["calls"][1]["scripted"] = True
    samples = samples_for([r], SampleConfig())
    trained = {seg["call_id"] for s in samples for seg in s["segments"] if seg["source"] == "OUTPUT"}
    assert trained == {r["calls"][0]["call_id"], r["calls"][2]["call_id"]}
    assert len(samples) == 2


def test_merge_when_the_prefix_holds() -> None:
    r = _rollout("r1", n=4)
    (merged,) = samples_for([r], SampleConfig(merge=True))
    assert merged["kind"] == "MERGED"
    last = rollout_call_tokens(r)[-1]
    a = arrays(merged)
    assert np.array_equal(a["ids"], np.concatenate([last.prompt, last.output]))
    assert a["mask"].sum() == 4 * 4  # every output once; tool results in between are masked
    check_provenance(merged, {"r1": r})
    assert [s["source"] for s in merged["segments"]] == ["PROMPT", "OUTPUT"] * 4


def test_merge_stops_at_prefix_breaks_failed_calls_and_the_length_cap() -> None:
    rng = np.random.default_rng(1)
    turns = growing_turns(rng, 6, 20, 4, 6, vocab=700)
    for i in range(2, 6):  # the template rewrote history from call 2 on
        rewritten = turns[i].prompt.copy()
        rewritten[5] += 1
        turns[i] = Turn(rewritten, turns[i].output)
    turns[4] = Turn(turns[4].prompt, np.zeros(0, np.uint32), status="ERROR")
    r = assemble(AttemptSpec("r1", "a1", turns))
    assert [link["is_prefix"] for link in r["prefix_links"]] == [True, False, True, True, True]
    samples = samples_for([r], SampleConfig(merge=True))
    chains = [[seg["call_index"] for seg in s["segments"] if seg["source"] == "OUTPUT"] for s in samples]
    assert chains == [[0, 1], [2, 3], [5]]
    for s in samples:
        check_provenance(s, {"r1": r})
    capped = samples_for([r], SampleConfig(merge=True, max_sample_tokens=50))
    capped_chains = [[g["call_index"] for g in s["segments"] if g["source"] == "OUTPUT"] for s in capped]
    assert capped_chains == [[0, 1], [2], [3], [5]]  # call 3 (50+ tokens) would exceed the cap


def test_packing_into_bins() -> None:
    rollouts = [_rollout(f"r{i}", n=2, seed=i) for i in range(3)]
    by_id = {r["rollout_id"]: r for r in rollouts}
    plain = samples_for(rollouts, SampleConfig())
    sizes = sorted(len(s["input_ids"]) // 4 for s in plain)
    packed = samples_for(rollouts, SampleConfig(pack={"enabled": True, "max_tokens": 80}))
    assert all(len(s["input_ids"]) // 4 <= 80 for s in packed)
    assert sorted(n for s in packed for n in np.diff([*arrays(s)["starts"], len(arrays(s)["ids"])])) == sizes
    assert any(s["kind"] == "PACKED" for s in packed) and len(packed) < len(plain)
    for s in packed:
        check_provenance(s, by_id)
        if s["kind"] == "PACKED":
            assert len(s["rollout_ids"]) >= 1 and len(arrays(s)["starts"]) >= 2
            assert s["sequence_starts"] == np.array(arrays(s)["starts"], "<i4").tobytes()
    oversized = samples_for(rollouts, SampleConfig(pack={"enabled": True, "max_tokens": 10}))
    assert [s["kind"] for s in oversized] == ["CALL"] * len(plain)  # too long to pack: left alone


def test_policy_version_span_and_weights() -> None:
    rng = np.random.default_rng(2)
    turns = growing_turns(rng, 3, 20, 4, 6, vocab=700)
    for i, t in enumerate(turns):
        t.policy_version = 10 + i
    r = assemble(AttemptSpec("r1", "a1", turns))
    assert r["policy_versions"] == [10, 11, 12]
    (merged,) = samples_for([r], SampleConfig(merge=True))
    assert (merged["policy_version_first"], merged["policy_version_last"]) == (10, 12)
    assert weight_by_rollout(merged)["r1"] == pytest.approx(1.0, rel=1e-6)


def test_filtered_rollouts_get_no_samples() -> None:
    rollouts = [_rollout("r1"), _rollout("r2", seed=5)]
    config = RewardConfig(metrics=[{"name": "m", "verifier": "v"}])  # zero variance filter on
    group = full_group(rollouts)
    rewards = compute_rewards(group, rollouts, constant_scores(group, rollouts, [1.0, 1.0]), config)
    credits = compute_credits(rollouts, rewards, CREDIT)
    assert credits == [] and build_samples(group, rollouts, rewards, credits, CREDIT, SampleConfig()) == []


def test_packing_never_mixes_subjects_and_a_forgotten_rollout_gives_no_sample() -> None:
    """Issue 31: a packed sample holds one subject's tokens (forgetting one drops whole samples and never
    changes another's weight); a rollout whose content was forgotten (still sealed after decoding) is skipped."""
    rollouts = [dict(_rollout(f"r{i}", seed=i), subject=s) for i, s in enumerate(["alice", "bob", "alice", None])]
    packed = samples_for(rollouts, SampleConfig(pack={"enabled": True, "max_tokens": 10_000}))
    by_subject = {s["subject"]: {r for r in s["rollout_ids"]} for s in packed}
    assert by_subject == {"alice": {"r0", "r2"}, "bob": {"r1"}, None: {"r3"}} and len(packed) == 3
    def totals(samples: list[dict]) -> dict[str, float]:
        out: dict[str, float] = {}
        for sample in samples:
            for rid, w in weight_by_rollout(sample).items():
                out[rid] = out.get(rid, 0.0) + w
        return out

    assert totals(packed) == pytest.approx(totals(samples_for(rollouts, SampleConfig())))  # no weight changes
    rollouts[1]["sealed"] = b"TTS1..."  # bob's rollout decoded without its key
    assert {r for s in samples_for(rollouts, SampleConfig()) for r in s["rollout_ids"]} == {"r0", "r2", "r3"}
