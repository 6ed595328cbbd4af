"""Group-relative verifiers: judge each rollout against the others of its group.

``GroupRank`` compares every pair of rollouts by an ordered list of keys (metrics of rollout-scope
verifiers that ran first, or rollout features such as the number of sampled tokens) and reports
wins / ties / losses, a win rate and a rank. ``MajorityVote`` scores agreement with the group's most
common final answer (no expected answer needed: self-consistency).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from processors.jsonutil import get_path
from processors.verifiers.answer_match import Extractor
from processors.verifiers.base import GroupVerifier, RolloutView
from processors.verifiers.extract import extract_answer, normalize_text, parse_number

FEATURES = ("sampled_tokens", "final_output_chars", "calls")


class RankKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    verifier: str | None = None  # a rollout-scope verifier's raw output ...
    path: str = ""  # ... at this dotted path
    feature: Literal["sampled_tokens", "final_output_chars", "calls"] | None = None
    prefer: Literal["high", "low"] = "high"

    @model_validator(mode="after")
    def _one_source(self) -> RankKey:
        if (self.verifier is None) == (self.feature is None):
            raise ValueError("a rank key names either a verifier (with path) or a feature")
        return self


class GroupRankOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: list[RankKey] = Field(default_factory=lambda: [
        RankKey(verifier="answer_match", path="score"), RankKey(feature="sampled_tokens", prefer="low")],
        min_length=1)


def _feature(view: RolloutView, name: str) -> float:
    if name == "sampled_tokens":
        return float(view.sampled_tokens)
    if name == "final_output_chars":
        return float(len(view.final_output_text))
    return float(len(view.rollout["calls"]))


class GroupRank(GroupVerifier):
    name: ClassVar[str] = "group_rank"
    version: ClassVar[str] = "1.0"
    Options = GroupRankOptions

    def _key(self, view: RolloutView, prior: dict[str, Any]) -> list[float | None]:
        opts: GroupRankOptions = self.options  # type: ignore[assignment]
        values: list[float | None] = []
        for key in opts.keys:
            if key.feature is not None:
                value: Any = _feature(view, key.feature)
            else:
                value = get_path(prior.get(key.verifier or "", {}), key.path, None)
            if isinstance(value, bool):
                value = float(value)
            values.append(float(value) if isinstance(value, int | float) else None)
        return values

    def _compare(self, a: list[float | None], b: list[float | None]) -> int:
        """+1 when a beats b, -1 when b beats a, 0 for a tie; a missing value loses."""
        opts: GroupRankOptions = self.options  # type: ignore[assignment]
        for key, x, y in zip(opts.keys, a, b, strict=True):
            if x == y:
                continue
            if x is None or y is None:
                return 1 if y is None else -1
            better = x > y if key.prefer == "high" else x < y
            return 1 if better else -1
        return 0

    def verify_group(self, views: list[RolloutView], prior: dict[str, dict[str, Any]]) -> dict[str, Any]:
        keys = {v.rollout_id: self._key(v, prior.get(v.rollout_id, {})) for v in views}
        out: dict[str, Any] = {}
        n = len(views)
        for v in views:
            outcomes = [self._compare(keys[v.rollout_id], keys[w.rollout_id]) for w in views if w is not v]
            wins, losses = outcomes.count(1), outcomes.count(-1)
            ties = len(outcomes) - wins - losses
            out[v.rollout_id] = {"wins": wins, "losses": losses, "ties": ties,
                                 "win_rate": (wins + 0.5 * ties) / (n - 1) if n > 1 else 0.5,
                                 "rank": 1 + losses, "keys": keys[v.rollout_id]}
        return out


class MajorityVoteOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    extract: Extractor = "auto"
    case_sensitive: bool = False
    numeric: bool = True  # answers that parse as numbers vote as numbers ("1,000" == "1000.0")


class MajorityVote(GroupVerifier):
    name: ClassVar[str] = "majority_vote"
    version: ClassVar[str] = "1.0"
    Options = MajorityVoteOptions

    def _answer(self, view: RolloutView) -> str | None:
        opts: MajorityVoteOptions = self.options  # type: ignore[assignment]
        answer = extract_answer(view.final_output_text, opts.extract)
        if answer is None:
            return None
        if opts.numeric:
            number = parse_number(answer)
            if number is not None:
                return repr(number)
        return normalize_text(answer, opts.case_sensitive) or None

    def verify_group(self, views: list[RolloutView], prior: dict[str, dict[str, Any]]) -> dict[str, Any]:
        answers = {v.rollout_id: self._answer(v) for v in views}
        counts = Counter(a for a in answers.values() if a is not None)
        top = max(counts.values(), default=0)
        leaders = sorted(a for a, c in counts.items() if c == top)
        majority = leaders[0] if leaders else None  # ties broken by the smallest answer, deterministically
        return {rid: {"answer": a, "majority": majority, "votes": counts.get(a, 0) if a else 0,
                      "share": (counts.get(a, 0) / len(views)) if a else 0.0, "tie": len(leaders) > 1,
                      "agrees": a is not None and a == majority,
                      "score": 1.0 if a is not None and a == majority else 0.0}
                for rid, a in answers.items()}
