"""Making a new subject's data key waits for the broker (acks=all); the gateway does it in a thread, so the
first record of a new subject does not stall the other calls on the event loop (producers/gateway/context.py,
schemas/kafka/key_store.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from producers.gateway.attempts import AttemptRegistry
from producers.gateway.context import GatewayContext
from producers.gateway.metrics import GatewayMetrics
from schemas.builders import make_call
from schemas.codec import Codec
from schemas.kafka.key_store import ForgetSettings, KafkaKeyStore
from schemas.sealing import Sealer
from tokentrail.settings import Settings

SLOW_BROKER_S = 2.0  # how long storing a new key takes in this test (a loaded broker)
BOUND_S = 1.0  # the most a call of a known subject may wait meanwhile (it takes milliseconds)


class _NoPublisher:
    async def deliver(self, topic: str, key: bytes, value: bytes) -> Any:
        raise AssertionError("nothing is delivered in this test")


def _slowed(store: KafkaKeyStore, started: threading.Event) -> None:
    """Store new keys on the real broker, SLOW_BROKER_S late, as a broker under load would."""
    real_mint = store._mint

    def slow_mint(subject: str) -> tuple[str, bytes]:
        started.set()
        time.sleep(SLOW_BROKER_S)
        return real_mint(subject)

    store._mint = slow_mint  # type: ignore[method-assign]


def test_a_new_subjects_key_does_not_stall_a_concurrent_call(
    tokentrail_settings: Settings, forget_settings: ForgetSettings
) -> None:
    store = KafkaKeyStore(tokentrail_settings.kafka, forget_settings)
    codec = Codec(sealer=Sealer(store))
    ctx = GatewayContext(registry=AttemptRegistry(), publisher=_NoPublisher(), codec=codec,
                         metrics=GatewayMetrics())
    known = make_call("r-known", "a1", 0, [1, 2, 3], [4], subject="user-known", request_json='{"q": "k"}')
    new = make_call("r-new", "a1", 0, [5, 6, 7], [8], subject="user-new", request_json='{"q": "NEW-CANARY"}')
    store.sealing_key("user-known")  # this subject's key exists already
    minting = threading.Event()
    _slowed(store, minting)

    async def scenario() -> tuple[bytes, float, bool]:
        first = asyncio.create_task(ctx.encode_ready("CallRecord", new))
        while not minting.is_set():  # the new subject's key is being made (in its thread)
            await asyncio.sleep(0.005)
        began = time.perf_counter()
        await ctx.encode_ready("CallRecord", known)
        waited = time.perf_counter() - began
        first_pending = not first.done()
        return await first, waited, first_pending

    try:
        sealed_new, waited, first_pending = asyncio.run(asyncio.wait_for(scenario(), timeout=60))
    finally:
        store.close()
    assert first_pending, "the new subject's record was encoded before its key was stored"
    assert waited < BOUND_S, f"a call of a known subject waited {waited:.2f} s for another subject's new key"
    # The key was stored on the broker: another process opens the record.
    reader = KafkaKeyStore(tokentrail_settings.kafka, forget_settings)
    try:
        assert Codec(sealer=Sealer(reader)).decode(sealed_new)[1]["request_json"] == '{"q": "NEW-CANARY"}'
    finally:
        reader.close()


def test_threads_asking_for_one_new_subject_share_one_key(
    tokentrail_settings: Settings, forget_settings: ForgetSettings
) -> None:
    store = KafkaKeyStore(tokentrail_settings.kafka, forget_settings)
    try:
        results: list[tuple[str, bytes]] = []
        threads = [threading.Thread(target=lambda: results.append(store.sealing_key("user-many"))) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(results) == 4 and len(set(results)) == 1
        assert store.key_ids("user-many") == [results[0][0]]  # one key on the topic, not four
    finally:
        store.close()
