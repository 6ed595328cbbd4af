"""While a gateway serves, what existed at start-up is frozen and young collections are rarer; on shutdown
both are undone, so the objects of an app that stopped can be collected again."""

from __future__ import annotations

import gc
import weakref

from producers.gateway.heap import YOUNG_THRESHOLD, serving_heap

from .conftest import GatewayFactory


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_frozen_while_serving_collected_after() -> None:
    before = gc.get_threshold()
    node = _Node()
    alive = weakref.ref(node)
    with serving_heap():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > 0
        del node
        gc.collect()
        assert alive() is not None  # frozen: not even a full collection looks at it
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    gc.collect()
    assert alive() is None


def test_a_served_gateway_tunes_the_collector_until_it_stops(start_gateway: GatewayFactory) -> None:
    before = gc.get_threshold()
    with start_gateway():
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD and gc.get_freeze_count() > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
