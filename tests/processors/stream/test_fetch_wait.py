"""The worker's consumer fetch wait (processors/stream/fetch.py): faust hard-codes 1,500 ms, which held
every pipeline hop up to that long (bench.freshness); the worker builds its aiokafka consumer with
``processors.fetch_max_wait_ms`` instead."""

from __future__ import annotations

import asyncio
import inspect

from aiokafka import AIOKafkaConsumer

from processors.stream.app import ProcessorsApp
from processors.stream.fetch import FAUST_FETCH_MAX_WAIT_MS, fetch_max_wait_ms
from processors.stream.worker_config import StreamConfig
from tokentrail.settings import Settings


def _built_wait(settings: Settings, wait_ms: int) -> int:
    proc = settings.processors.model_copy(update={"fetch_max_wait_ms": wait_ms})
    worker = ProcessorsApp(StreamConfig.resolve(settings.kafka, proc, topic_prefix="fetch-wait-test"))

    async def build() -> int:
        consumer = worker.app.consumer._thread._create_worker_consumer(worker.app.transport)
        try:
            return fetch_max_wait_ms(consumer)
        finally:
            await consumer.stop()  # never started: only releases its client

    return asyncio.run(build())


def test_the_worker_consumer_waits_what_the_settings_say_not_fausts_1500_ms(tokentrail_settings: Settings) -> None:
    assert tokentrail_settings.processors.fetch_max_wait_ms < FAUST_FETCH_MAX_WAIT_MS
    assert _built_wait(tokentrail_settings, 37) == 37
    assert _built_wait(tokentrail_settings, FAUST_FETCH_MAX_WAIT_MS) == FAUST_FETCH_MAX_WAIT_MS
    # aiokafka builds its fetcher from the attribute set here when the consumer starts.
    assert "fetch_max_wait_ms=self._fetch_max_wait_ms" in inspect.getsource(AIOKafkaConsumer.start)
