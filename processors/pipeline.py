"""The one function that turns a closed group into scores, rewards, credits and samples.

The faust app, the replay command and the tests all call ``process_group`` (verifiers run) or
``rederive`` (stored scores, no verifier runs: new reward / credit / sample configurations over old
data; new events carry the new config ids, old ones stay).

LATE groups: rollout-scope verifiers still score them (raw outputs are reviewable), their rewards
are filtered ("late"), so they get no credit and no samples. Group-scope verifiers are not run on a
LATE record (it is not a group of peers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from processors.config import load_config
from processors.credit import CreditConfig, compute_credits
from processors.errors import PipelineInputError
from processors.rewards import RewardConfig, compute_rewards
from processors.samples import SampleConfig, build_samples
from processors.verifiers.base import Verifier
from processors.verifiers.runner import VerifierRunner, prior_raw

Record = dict[str, Any]


@dataclass
class Derived:
    scores: list[Record] = field(default_factory=list)
    rewards: list[Record] = field(default_factory=list)
    credits: list[Record] = field(default_factory=list)
    samples: list[Record] = field(default_factory=list)

    def events(self) -> list[tuple[str, Record]]:
        """(schema name, record) in dependency order, for producing to the topics."""
        return ([("Score", s) for s in self.scores] + [("Reward", r) for r in self.rewards]
                + [("Credit", c) for c in self.credits] + [("Sample", s) for s in self.samples])


@dataclass(frozen=True)
class StageConfigs:
    reward: RewardConfig
    credit: CreditConfig
    sample: SampleConfig

    @classmethod
    def load(cls, reward: Any, credit: Any, sample: Any) -> StageConfigs:
        """From YAML paths, YAML text, dicts or models (see processors.config.load_config)."""
        return cls(load_config(RewardConfig, reward), load_config(CreditConfig, credit),
                   load_config(SampleConfig, sample))


def order_rollouts(group: Record, rollouts: list[Record]) -> list[Record]:
    """The group's rollouts in the group record's order; every member present, nothing extra."""
    by_event = {r["event_id"]: r for r in rollouts}
    wanted = list(group["rollout_event_ids"])
    missing = [e for e in wanted if e not in by_event]
    extra = sorted(set(by_event) - set(wanted))
    if missing or extra:
        raise PipelineInputError(f"group {group['event_id']}: rollouts do not match its members "
                                 f"(missing {missing}, not members {extra})")
    ordered = [by_event[e] for e in wanted]
    for r in ordered:
        if r["status"] != "COMPLETE":
            raise PipelineInputError(f"rollout {r['event_id']} is {r['status']}; only complete rollouts "
                                     "are scored")
    return ordered


def score_group(group: Record, rollouts: list[Record], verifiers: list[Verifier],
                runner: VerifierRunner) -> list[Record]:
    """Raw scores: rollout-scope verifiers first, then group-scope ones (which see the first ones)."""
    rollouts = order_rollouts(group, rollouts)
    scores: list[Record] = []
    for v in verifiers:
        if v.scope == "ROLLOUT":
            scores += runner.score_rollouts(v, rollouts, group)
    if group["status"] != "LATE":
        prior = prior_raw(scores)
        for v in verifiers:
            if v.scope == "GROUP":
                scores += runner.score_group(v, rollouts, group, prior)
    return scores


def rederive(group: Record, rollouts: list[Record], scores: list[Record], reward_cfg: RewardConfig,
             credit_cfg: CreditConfig, sample_cfg: SampleConfig) -> Derived:
    """Rewards, credits and samples from stored scores; no verifier runs. Returns the scores used."""
    rollouts = order_rollouts(group, rollouts)
    members = {r["event_id"] for r in rollouts}
    mine: list[Record] = []
    seen: set[str] = set()
    for s in scores:  # re-deliveries of a score share its id: keep the first
        if s["event_id"] in seen or s["rollout_event_id"] not in members:
            continue
        if s["scope"] == "ROLLOUT" or s["group_id"] == group["group_id"]:
            seen.add(s["event_id"])
            mine.append(s)
    rewards = compute_rewards(group, rollouts, mine, reward_cfg)
    credits = compute_credits(rollouts, rewards, credit_cfg)
    samples = build_samples(group, rollouts, rewards, credits, credit_cfg, sample_cfg)
    return Derived(scores=mine, rewards=rewards, credits=credits, samples=samples)


def process_group(group: Record, rollouts: list[Record], verifiers: list[Verifier], reward_cfg: RewardConfig,
                  credit_cfg: CreditConfig, sample_cfg: SampleConfig, *,
                  runner: VerifierRunner) -> Derived:
    """Score a closed group with the verifiers, then derive rewards, credits and samples."""
    scores = score_group(group, rollouts, verifiers, runner)
    derived = rederive(group, rollouts, scores, reward_cfg, credit_cfg, sample_cfg)
    derived.scores = scores
    return derived
