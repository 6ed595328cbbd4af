"""The worker's Kafka consumer with a chosen fetch wait: records are handed on as soon as they arrive.

aiokafka keeps at most one fetch request in flight per broker, and a partition whose buffered records
the agents have just taken is only fetched again in the next request. While one request waits on the
broker for other, idle partitions, the freshly drained partition waits with it, up to the request's
``fetch_max_wait_ms``; faust hard-codes 1,500 ms there. Every hop of the pipeline (calls -> assembler
-> rollouts -> router -> by-group -> grouper) could wait that long with the records already on Kafka:
measured by ``bench.freshness``, finish -> sample p50 ~1 s at 20 rollouts/s (issue 30).

``install_fetch_wait`` gives an app a transport whose worker consumer waits ``fetch_max_wait_ms`` at
most. Lower costs an empty fetch round trip per wait on an idle worker (a few per second at 50 ms),
nothing when records flow. The value (``processors.fetch_max_wait_ms``) is chosen by measurement
(docs/performance.md, freshness).
"""

from __future__ import annotations

from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

FAUST_FETCH_MAX_WAIT_MS = 1500  # what faust passes to aiokafka


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # faust passes fetch_max_wait_ms=1500 with no setting to change it; aiokafka reads this
        # attribute when it builds its fetcher (AIOKafkaConsumer.start), after this returns.
        consumer._fetch_max_wait_ms = transport.fetch_max_wait_ms
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _Transport(faust_aiokafka.Transport):
    Consumer = _Consumer
    fetch_max_wait_ms: int = FAUST_FETCH_MAX_WAIT_MS


def install_fetch_wait(app: faust.App, fetch_max_wait_ms: int) -> None:
    """Before the app is started: its worker consumer waits at most ``fetch_max_wait_ms`` per fetch."""
    if fetch_max_wait_ms < 0:
        raise ValueError("fetch_max_wait_ms must be >= 0")
    transport = _Transport(app.conf.broker_consumer, app)
    transport.fetch_max_wait_ms = int(fetch_max_wait_ms)
    app.transport = transport


def fetch_max_wait_ms(consumer: Any) -> int:
    """The fetch wait an aiokafka consumer was built with (for tests and the worker's log)."""
    return int(consumer._fetch_max_wait_ms)
