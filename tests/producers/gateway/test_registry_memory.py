"""The attempt registry's memory budget in bytes: what each attempt keeps is counted, the least recently
used idle state is shed over the budget, abandoned unfinished attempts are trimmed with their keys, and a
live attempt is never broken by either."""

from __future__ import annotations

import time

import numpy as np
import pytest

from producers.gateway.attempt_state import AttemptState, DeliveredCall, SampledOutput
from producers.gateway.attempts import AttemptRegistry
from producers.gateway.errors import GatewayError
from producers.gateway.identity import resolve_call

MiB = 1024 * 1024


def _call(state: AttemptState, prompt_tokens: int, output_tokens: int = 64) -> None:
    """One delivered chat call of ``state`` with a prompt of ``prompt_tokens`` ids."""
    index = state.begin_call()
    prompt = np.arange(prompt_tokens, dtype=np.uint32)
    output = np.arange(output_tokens, dtype=np.uint32)
    state.remember(DeliveredCall(f"c{index}", index, prompt, output),
                   SampledOutput(f"c{index}", index, output, {"role": "assistant", "content": "x" * 100}))
    state.end_call()


def _kept_bytes(registry: AttemptRegistry) -> int:
    """The id arrays the registry's states really hold, counted independently of its ledger."""
    states = list(registry._active.values()) + list(registry._sessions.values())
    return sum(int(c.prompt_ids.nbytes + c.output_ids.nbytes) for s in states for c in s.recent) + \
        sum(int(o.output_ids.nbytes) for s in states for o in s.outputs.values())


def test_many_sessions_with_large_prompts_stay_under_the_byte_budget() -> None:
    budget = 4 * MiB
    registry = AttemptRegistry(max_bytes=budget)
    for n in range(60):  # 60 attempts and 60 unattributed sessions, 3 calls of 40k-token prompts each
        attempt = registry.start(None, {"task_input": n})
        session = registry.unattributed(f"session-{n}")
        for _ in range(3):
            _call(attempt, 40_000)
            _call(session, 40_000)
        assert registry.bytes_used <= budget
    # Unbounded, that would be 120 states x 2 kept prompts x 160 kB = 38 MB.
    assert _kept_bytes(registry) <= registry.bytes_used <= budget
    assert registry.shed_bytes > 30 * MiB
    # Every attempt is still live with its counters and key: only idle state was shed.
    assert registry.counts()["active"] == 60
    memory = registry.memory()
    assert memory["max_bytes"] == budget and memory["bytes"] == registry.bytes_used


def test_shedding_takes_prompts_before_outputs_and_spares_calls_in_flight() -> None:
    registry = AttemptRegistry(max_bytes=2 * MiB)
    old = registry.start(None, {})
    _call(old, 100_000)  # 400 kB prompt
    live = registry.start(None, {})
    index = live.begin_call()  # in flight while the budget is passed
    live.remember(DeliveredCall("l0", index, np.zeros(300_000, np.uint32), np.zeros(8, np.uint32)),
                  SampledOutput("l0", index, np.zeros(8, np.uint32), {"role": "assistant", "content": "y"}))
    # 400 kB + 1.2 MB + a new one of 600 kB passes 2 MiB: the least recently used idle prompts go first,
    # and they are enough.
    newer = registry.start(None, {})
    _call(newer, 150_000)
    assert not old.recent and old.outputs, "the idle attempt's prompts are shed, its outputs kept (splicing)"
    assert live.recent and live.outputs, "a call in flight keeps what it remembered"
    assert registry.bytes_used <= registry.max_bytes
    live.end_call()
    assert registry.get_active(old.rollout_id, old.attempt_id) is old


def test_failed_and_finished_attempts_give_their_bytes_back() -> None:
    registry = AttemptRegistry(max_bytes=64 * MiB)
    empty = registry.bytes_used
    state = registry.start(None, {"task_input": "t"})
    _call(state, 10_000)
    assert registry.bytes_used > empty + 40_000
    registry.finish(state.rollout_id, state.attempt_id, "SUCCESS")
    assert not state.recent and not state.outputs
    assert registry.bytes_used < empty + 4096, "a finished attempt keeps a tombstone and its start only"


def test_idle_unfinished_attempts_are_trimmed_with_their_keys() -> None:
    registry = AttemptRegistry(idle_ttl_s=0.2)
    abandoned = registry.start(None, {})
    _call(abandoned, 1000)
    busy = registry.start(None, {})
    busy.begin_call()  # a call in flight is never idle
    before = registry.bytes_used
    time.sleep(0.3)
    assert registry.expire_idle() == 1
    assert registry.by_api_key(abandoned.api_key) is None, "an abandoned attempt's key is trimmed"
    assert registry.by_api_key(busy.api_key) == busy.key
    assert registry.bytes_used < before - 4000
    # Its later calls get a clear answer, by path (410) and by key (401), never a fresh index.
    with pytest.raises(GatewayError) as by_path:
        resolve_call({"rollout_id": abandoned.rollout_id, "attempt_id": abandoned.attempt_id}, {}, registry,
                     unattributed="record", require_auth=False, admin_key="")
    assert by_path.value.status == 410 and by_path.value.code == "attempt_expired"
    with pytest.raises(GatewayError) as by_key:
        resolve_call({}, {"authorization": f"Bearer {abandoned.api_key}"}, registry, unattributed="record",
                     require_auth=False, admin_key="")
    assert by_key.value.status == 401
    # The rollout may start its next attempt.
    retry = registry.start(abandoned.rollout_id, registry.start_info(abandoned.rollout_id))
    assert retry.attempt_number == 2


def test_keys_are_derived_from_the_secret_so_another_registry_recognizes_them() -> None:
    first = AttemptRegistry(key_secret=b"s" * 32)
    state = first.start("r-keys", {})
    again = AttemptRegistry(key_secret=b"s" * 32)
    other = AttemptRegistry(key_secret=b"t" * 32)
    assert again.api_key_for("r-keys", state.attempt_id) == state.api_key
    assert other.api_key_for("r-keys", state.attempt_id) != state.api_key
    assert state.api_key.startswith("tt-") and len(state.api_key) >= 32
