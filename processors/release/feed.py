"""The release controller processor's core, pure: CallRecords, Rewards and ReleaseDecisions in, decisions out.

Feed it every record in the order it was read; it returns the ReleaseDecision records to write.

- Calls: each names its rollout, model (the release track) and policy version, so they fill a bounded
  map rollout id -> (model, version) that rewards are attributed by (a rollout's calls exist before its
  reward can; a reward read before its rollout's calls, as when the two topics are read together after a
  restart, waits for them in a bounded buffer); each is also a call observation (status,
  ``timings.total_ms``). Scripted calls (outputs the engine was given, not sampled) are not observations
  of the policy and are skipped. Nor are calls the client aborted (``error.type`` ``client_disconnected``):
  their latency and status are the client's doing, so a caller aborting streams on one arm cannot make that
  version look failing; they are counted apart, per version (``client_aborts``).
- Rewards: ``raw_reward``, the combined metric before group normalization (the normalized ``reward`` has
  mean zero within each group and says nothing about versions), of the rollout's version. A reward
  filtered for a score error has no meaningful value and is skipped. Rewards of one source are compared:
  the verifiers' (default) or the feedback join's (``components_json`` says ``"source": "feedback"``), never
  the two mixed, since they measure different things on different scales. A reward measured against a
  baseline (``"source": "baseline"``, baselines without siblings) restates a feedback reward already
  counted, with the same ``raw_reward``; it is never counted again.
- Pinned (evaluation) traffic: a call whose record says the release routed it on the ``pinned`` arm (the
  record's ``release``: release id, decision sequence, arm, pin label) is left out of the comparison, and so
  is the reward of its rollout; both are counted per model and pin label (``pinned``). A call's arm is also
  checked against the decision log: when the traffic after the decision it was routed by has another release
  id, or gives its arm another version than the one that produced its tokens (an upstream that could not
  serve the version it was routed to), it is counted in ``arm_disagreements``; it is observed by the version
  that produced its tokens, as every call is.
- Decisions: the topic is the truth. A decision (the controller's own or an operator's) changes the
  state only when it is read back, through the same fold every reader uses (``DecisionLog``); until its
  own decision on a model is read back the controller makes no other decision on it. A ramp or pin read
  back keeps the totals counted so far; a start, promotion or rollback starts from zero.
"""

from __future__ import annotations

import json
from collections import Counter, OrderedDict
from dataclasses import replace
from typing import Any

from processors.release.arms import ArmStats, CallObservation, RewardObservation
from processors.release.controller import CONTROLLER, ReleaseState, decide, fold_call, fold_reward
from processors.release.events import DecisionLog, decision_record
from schemas.call_errors import CLIENT_DISCONNECTED
from schemas.release_traffic import Traffic, traffic_after

Record = dict[str, Any]

DEFAULT_MAX_ROLLOUTS = 200_000  # rollouts whose version is remembered (oldest forgotten first)
DEFAULT_MAX_WAITING = 20_000  # rewards waiting for their rollout's calls (oldest given up first)
MIXED = -1  # the version of a rollout whose calls were served by different versions
PINNED = "pinned"  # the release arm of evaluation traffic (CallRecord.release.arm)


REWARD_SOURCES = ("verifier", "feedback")


DERIVED_SOURCES = ("baseline",)  # rewards that restate another reward (same raw_reward): never counted


def reward_source(record: Record) -> str:
    """``feedback`` for a reward the feedback join derived, ``baseline`` for one measured against a baseline
    window, else ``verifier``."""
    components = record.get("components_json") or ""
    if '"source"' not in components:  # cheap: most rewards never need parsing
        return "verifier"
    try:
        parsed = json.loads(components)
    except ValueError:
        return "verifier"
    source = parsed.get("source") if isinstance(parsed, dict) else None
    return source if source in ("feedback", *DERIVED_SOURCES) else "verifier"


class ReleaseFeed:
    def __init__(self, max_rollouts: int = DEFAULT_MAX_ROLLOUTS, max_waiting: int = DEFAULT_MAX_WAITING,
                 source: str = "verifier") -> None:
        if source not in REWARD_SOURCES:
            raise ValueError(f"reward source must be one of {REWARD_SOURCES}, not {source!r}")
        self.source = source
        self.log = DecisionLog.fold([])
        self.states: dict[str, ReleaseState] = {}  # the log's states plus the totals counted since
        # rollout id -> (model, version, pin label or None: not pinned)
        self.rollouts: OrderedDict[str, tuple[str, int, str | None]] = OrderedDict()
        self.max_rollouts = max_rollouts
        self.waiting: OrderedDict[str, list[Record]] = OrderedDict()  # rollout id -> rewards read before its calls
        self.max_waiting = max_waiting
        self.pending: dict[str, str] = {}  # model -> event id of our decision not read back yet
        self.skipped: Counter[str] = Counter()  # inputs that are not observations, by reason
        self.counts: Counter[str] = Counter()  # calls, rewards and decisions folded
        self.client_aborts: Counter[tuple[str, int]] = Counter()  # (model, version) -> calls the client aborted
        self.pinned: Counter[tuple[str, str, str]] = Counter()  # (model, pin label, "calls" | "rewards")
        self.arm_disagreements: Counter[tuple[str, str]] = Counter()  # (model, arm on the record)
        self.traffic_at: dict[tuple[str, int], Traffic] = {}  # (model, decision sequence) -> traffic after it

    # ---- inputs -----------------------------------------------------------------------------------

    def on_decision(self, record: Record) -> None:
        model = record.get("model")
        if isinstance(model, str) and self.pending.get(model) == record.get("event_id"):
            del self.pending[model]
        if not self.log.add(record):
            self.skipped["stale or malformed decision"] += 1
            return
        self.counts["decisions"] += 1
        self.traffic_at[(record["model"], int(record["sequence"]))] = traffic_after(record)
        folded, old = self.log.states[record["model"]], self.states.get(record["model"])
        if record["action"] in ("ramp", "pin") and old is not None and old.release_id == folded.release_id:
            # Keep what was counted since; an operator's ramp starts its stage at today's count.
            start = folded.stage_start_rewards if record["source"] == CONTROLLER else old.candidate.rewards
            folded = replace(folded, serving=old.serving, candidate=old.candidate,
                             stage_start_rewards=start if record["action"] == "ramp" else old.stage_start_rewards)
        elif record["action"] in ("ramp", "pin"):  # no totals counted here yet: count afresh
            folded = replace(folded, serving=ArmStats(), candidate=ArmStats())
        self.states[record["model"]] = folded

    def on_call(self, record: Record) -> list[Record]:
        if record.get("scripted"):
            self.skipped["scripted call"] += 1
            return []
        versions, timings = record["versions"], record["timings"]
        model, version = versions["model"], int(versions["policy_version"])
        release = record.get("release")  # absent before CallRecord v3, null when no release routed the call
        pin = (release.get("pin_label") or "") if release and release.get("arm") == PINNED else None
        self._remember(record["rollout_id"], model, version, pin)
        self.counts["calls"] += 1
        if pin is not None:
            self.pinned[(model, pin, "calls")] += 1
        out: list[Record] = []
        state = self.states.get(model)
        self._check_arm(model, release, version)
        if _client_aborted(record):
            self.client_aborts[(model, version)] += 1
        elif state is not None:
            latency_ms = max(float(timings["total_ms"]), 0.0)
            observation = CallObservation(version, record["status"] == "OK", latency_ms, pinned=pin is not None)
            try:
                self.states[model] = fold_call(state, observation)
            except ValueError:
                self.skipped["call whose latency is not a finite number"] += 1
            else:
                out = self._decide(model, int(timings["received_at_us"]))
        for reward in self.waiting.pop(record["rollout_id"], []):
            out += self.on_reward(reward)
        return out

    def on_reward(self, record: Record) -> list[Record]:
        source = reward_source(record)
        if source in DERIVED_SOURCES:
            self.skipped["reward measured against a baseline (its input reward is counted)"] += 1
            return []
        if source != self.source:
            self.skipped[f"reward from the other source (comparing {self.source} rewards)"] += 1
            return []
        reason = record.get("filter_reason") or ""
        if record.get("filtered") and reason.startswith("score_error"):
            self.skipped["reward filtered for a score error"] += 1
            return []
        known = self.rollouts.get(record["rollout_id"])
        if known is None:
            self.waiting.setdefault(record["rollout_id"], []).append(record)
            while len(self.waiting) > self.max_waiting:
                _, given_up = self.waiting.popitem(last=False)
                self.skipped["reward of a rollout with no call seen"] += len(given_up)
            return []
        model, version, pin = known
        if pin is not None:  # evaluation traffic: reported per pin, never compared
            self.pinned[(model, pin, "rewards")] += 1
            self.counts["rewards"] += 1
            return []
        if version == MIXED:
            self.skipped["reward of a rollout served by several versions"] += 1
            return []
        state = self.states.get(model)
        if state is None:
            self.counts["rewards"] += 1
            return []
        try:
            self.states[model] = fold_reward(state, RewardObservation(version, float(record["raw_reward"])))
        except ValueError:
            self.skipped["reward that is not a finite number"] += 1
            return []
        self.counts["rewards"] += 1
        return self._decide(model, int(record["created_at_us"]))

    # ---- deciding ---------------------------------------------------------------------------------

    def _remember(self, rollout_id: str, model: str, version: int, pin: str | None) -> None:
        known = self.rollouts.get(rollout_id)
        if known is not None and known[1] != version:
            version = MIXED  # its reward cannot be attributed to one version
        if known is not None and known[2] is not None:
            pin = known[2]  # one pinned call makes the rollout evaluation traffic
        self.rollouts[rollout_id] = (model, version, pin)
        self.rollouts.move_to_end(rollout_id)
        while len(self.rollouts) > self.max_rollouts:
            self.rollouts.popitem(last=False)

    def _check_arm(self, model: str, release: Record | None, version: int) -> None:
        """Does the record's release arm agree with the decision log? The traffic after the decision the call
        was routed by must have the record's release id, and the arm's version must be the call's version."""
        if not release:
            return
        traffic = self.traffic_at.get((model, int(release["decision_sequence"])))
        if traffic is None:
            return  # a decision this controller has not read yet (or no longer remembers)
        arm = str(release.get("arm"))
        expected = {"serving": traffic.serving_version, "candidate": traffic.candidate_version,
                    PINNED: traffic.pinned.get(release.get("pin_label") or "")}.get(arm)
        if traffic.release_id != release.get("release_id") or expected != version:
            self.arm_disagreements[(model, arm)] += 1

    def _decide(self, model: str, at_us: int) -> list[Record]:
        if model in self.pending:
            return []
        state = self.states[model]
        decision = decide(state)
        if decision.action == "hold":
            return []
        record, _ = decision_record(state, decision, created_at_us=at_us)
        self.pending[model] = record["event_id"]
        return [record]

    def release_starts_us(self) -> dict[str, int]:
        """When each model's current release started (from the start decision read back): where a restarted
        controller re-reads calls and rewards from."""
        starts: dict[str, int] = {}
        for record in self.log.applied:
            if record["action"] == "start":
                starts[record["model"]] = record["created_at_us"]
        return {m: t for m, t in starts.items() if self.states[m].candidate_version is not None}


def _client_aborted(record: Record) -> bool:
    error = record.get("error")
    return record["status"] == "ERROR" and bool(error) and error.get("type") == CLIENT_DISCONNECTED
