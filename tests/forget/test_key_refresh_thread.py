"""The key store re-reads the key topic on a thread of its own (schemas/kafka/key_store.py): a thread asking
for a key answers from memory, however slow a re-read is, and never reads Kafka itself (the gateway asks on
its event loop); a forget made by another process is still seen within ``forget.refresh_s``."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

from confluent_kafka import Consumer

from schemas.builders import make_call
from schemas.codec import Codec
from schemas.kafka.key_store import ForgetSettings, KafkaKeyStore
from schemas.sealing import Sealer, is_forgotten
from tokentrail.settings import Settings

SLOW_READ_S = 2.0  # how long one re-read of the key topic takes in the first test (a broker under load)
LOOKUP_BOUND_S = 0.5  # the most one key lookup may take meanwhile (it takes microseconds)


class _WatchedConsumer:
    """The key store's consumer, noting which threads use it; its re-reads SLOW_READ_S late once ``slow``."""

    def __init__(self, real: Consumer, slow: threading.Event, slowed: threading.Event, threads: set[int]) -> None:
        self._real, self._slow, self._slowed, self._threads = real, slow, slowed, threads

    def get_watermark_offsets(self, *args: Any, **kwargs: Any) -> Any:
        self._threads.add(threading.get_ident())
        if self._slow.is_set():
            self._slowed.set()
            time.sleep(SLOW_READ_S)
        return self._real.get_watermark_offsets(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _watched(store: KafkaKeyStore, slow: threading.Event, slowed: threading.Event) -> set[int]:
    threads: set[int] = set()
    real_new = store._new_consumer
    store._new_consumer = lambda: _WatchedConsumer(real_new(), slow, slowed, threads)  # type: ignore[method-assign,assignment,return-value]
    return threads


def test_a_slow_reread_does_not_delay_key_lookups(
    tokentrail_settings: Settings, forget_settings: ForgetSettings
) -> None:
    kafka = tokentrail_settings.kafka
    writer, reader = KafkaKeyStore(kafka, forget_settings), KafkaKeyStore(kafka, forget_settings)
    slow, slowed = threading.Event(), threading.Event()
    threads = _watched(reader, slow, slowed)
    try:
        write, read = Codec(sealer=Sealer(writer)), Codec(sealer=Sealer(reader))
        data = write.encode("CallRecord", make_call("r1", "a1", 0, [1, 2, 3], [4, 5], subject="user-slow",
                                                    request_json='{"q": "CANARY-SLOW"}'))
        assert read.decode(data)[1]["request_json"] == '{"q": "CANARY-SLOW"}'  # first use: the key is read
        slow.set()
        assert slowed.wait(10), "the key store did not re-read the topic on its own"
        began = time.monotonic()
        waits = []
        for _ in range(15):  # lookups while the re-read hangs, for longer than refresh_s (0.2 s)
            t0 = time.perf_counter()
            assert read.decode(data)[1]["request_json"] == '{"q": "CANARY-SLOW"}'
            assert writer.sealing_key("user-slow") and reader.sealing_key("user-slow")
            waits.append(time.perf_counter() - t0)
            time.sleep(0.05)
        during = time.monotonic() - began
        assert during < SLOW_READ_S, f"the lookups took {during:.2f} s, not all during the slow re-read"
        assert max(waits) < LOOKUP_BOUND_S, f"a key lookup waited {max(waits):.2f} s for a re-read"
        assert threading.get_ident() not in threads, "a thread asking for a key read the key topic itself"
        assert len(threads) == 1  # the store's own thread, alone
        print(f"slowest of {len(waits)} lookups during a {SLOW_READ_S:.0f} s re-read: {max(waits) * 1e3:.2f} ms")
    finally:
        slow.clear()
        writer.close()
        reader.close()


_FORGET_ELSEWHERE = """
import sys, time
from schemas.kafka.config import KafkaSettings
from schemas.kafka.key_store import ForgetSettings, KafkaKeyStore
store = KafkaKeyStore(KafkaSettings(bootstrap_servers=sys.argv[1]), ForgetSettings(keys_topic=sys.argv[2]))
gone = store.destroy(sys.argv[3])
print(time.time(), len(gone), flush=True)
store.close()
"""


def test_a_forget_in_another_process_is_seen_within_refresh_s(
    tokentrail_settings: Settings, forget_settings: ForgetSettings
) -> None:
    kafka = tokentrail_settings.kafka
    # The store re-reads every refresh_s / 2 (1 s here), and a read is a broker round trip or two, which take
    # up to half a second on a loaded 2-core machine: refresh_s holds them with room to spare.
    settings = ForgetSettings(**{**forget_settings.model_dump(), "refresh_s": 2.0})
    writer, reader = KafkaKeyStore(kafka, settings), KafkaKeyStore(kafka, settings)
    threads = _watched(reader, threading.Event(), threading.Event())
    try:
        data = Codec(sealer=Sealer(writer)).encode(
            "CallRecord", make_call("r1", "a1", 0, [1, 2, 3], [4, 5], subject="user-far"))
        read = Codec(sealer=Sealer(reader))
        opened = read.decode(data)[1]
        assert not is_forgotten(opened)
        (key_id,) = writer.key_ids("user-far")
        done = subprocess.run([sys.executable, "-c", _FORGET_ELSEWHERE, kafka.bootstrap_servers,
                               settings.keys_topic, "user-far"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        forgotten_at, destroyed = done.stdout.split()
        assert destroyed == "1"
        # From now on only lookups: whoever sees the tombstone, it is the store's own thread.
        deadline = time.monotonic() + 10
        while reader.opening_key(key_id) is not None:
            assert time.monotonic() < deadline, "the other process's forget was never seen"
            time.sleep(0.01)
        seen_after = time.time() - float(forgotten_at)
        print(f"a forget made in another process seen here {seen_after:.3f} s later")
        assert seen_after < settings.refresh_s, f"the forget was seen {seen_after:.2f} s after it was made"
        assert is_forgotten(read.decode(data)[1])
        assert threading.get_ident() not in threads and len(threads) == 1
    finally:
        writer.close()
        reader.close()
