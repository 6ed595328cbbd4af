"""Credit: rollout / call / token level advantages and weights; the reward itself is untouched."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from processors.config import load_config
from processors.credit import CreditConfig, compute_credit, compute_credits, token_values
from processors.errors import ConfigError
from schemas.tokens import unpack_floats
from testkit.stages import AttemptSpec, Turn, assemble, growing_turns


@pytest.fixture(scope="module")
def rollout() -> dict:
    rng = np.random.default_rng(0)
    turns = growing_turns(rng, 4, 10, 3, 2, vocab=500)
    turns[2] = Turn(turns[2].prompt, np.zeros(0, np.uint32), status="ERROR")  # a failed call in between
    turns[3] = Turn(turns[3].prompt, np.arange(5, dtype=np.uint32))
    return assemble(AttemptSpec("r1", "a1", turns))


REWARD = {"event_id": "rw-1", "group_id": "g", "reward": 2.0, "filtered": False, "created_at_us": 7}


def test_rollout_level(rollout: dict) -> None:
    reward = copy.deepcopy(REWARD)
    credit = compute_credit(rollout, reward, CreditConfig())
    assert reward == REWARD
    assert credit["level"] == "ROLLOUT" and credit["rollout_advantage"] == 2.0
    assert credit["call_ids"] == rollout["call_ids"]
    assert unpack_floats(credit["call_advantages"]).tolist() == [2.0, 2.0, 0.0, 2.0]
    assert credit["sampled_tokens"] == 3 + 3 + 5 and credit["rollout_weight"] == 1.0
    assert credit["reward_id"] == "rw-1" and credit["created_at_us"] == 7
    tv = token_values(rollout, credit, CreditConfig())
    assert tv.offsets.tolist() == [0, 3, 6, 6, 11]
    assert np.allclose(tv.weights, 1 / 11) and np.all(tv.advantages == 2.0)


def test_call_level_discount_across_turns(rollout: dict) -> None:
    cfg = CreditConfig(level="call", call_discount=0.5)
    credit = compute_credit(rollout, REWARD, cfg)
    # three successful calls: the last gets the reward, earlier ones 0.5 and 0.25 of it
    assert unpack_floats(credit["call_advantages"]).tolist() == [0.5, 1.0, 0.0, 2.0]
    assert credit["rollout_advantage"] == 2.0  # the raw reward is kept as is
    tv = token_values(rollout, credit, cfg)
    assert tv.advantages.tolist() == [0.5] * 3 + [1.0] * 3 + [2.0] * 5


def test_token_level_discount(rollout: dict) -> None:
    cfg = CreditConfig(level="token", token_discount=0.5)
    credit = compute_credit(rollout, REWARD, cfg)
    tv = token_values(rollout, credit, cfg)
    assert tv.advantages[-1] == 2.0 and tv.advantages[-2] == 1.0
    assert tv.advantages[0] == pytest.approx(2 * 0.5**10)
    last_call = np.mean(2 * 0.5 ** np.arange(4, -1, -1))
    assert unpack_floats(credit["call_advantages"])[3] == pytest.approx(last_call)


def test_weightings(rollout: dict) -> None:
    per_call = CreditConfig(weighting="call_mean", rollout_weight=3.0)
    tv = token_values(rollout, compute_credit(rollout, REWARD, per_call), per_call)
    sums = [float(tv.weights[tv.offsets[i]:tv.offsets[i + 1]].sum()) for i in range(4)]
    assert sums == pytest.approx([1.0, 1.0, 0.0, 1.0])
    per_token = CreditConfig(weighting="token_sum", rollout_weight=0.5)
    credit = compute_credit(rollout, REWARD, per_token)
    assert credit["rollout_weight"] == 0.5 * 11
    assert np.allclose(token_values(rollout, credit, per_token).weights, 0.5)


def test_filtered_rewards_get_no_credit_and_configs_are_checked(rollout: dict) -> None:
    assert compute_credits([rollout], [dict(REWARD, filtered=True)], CreditConfig()) == []
    credit = compute_credit(rollout, REWARD, CreditConfig())
    with pytest.raises(ValueError, match="was made by config"):
        token_values(rollout, credit, CreditConfig(level="call"))
    with pytest.raises(ConfigError, match="call_discount"):
        load_config(CreditConfig, {"call_discount": 1.5})
    shipped = load_config(CreditConfig, "deploy/config/credit.yaml")
    assert shipped.level == "rollout" and shipped.id == CreditConfig(name="rollout-token-mean").id
