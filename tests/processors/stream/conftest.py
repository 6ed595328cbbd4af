"""A private pipeline per test: its own topic prefix, app id and state dir on the shared broker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from schemas.kafka_config import admin_config
from testkit.kafka_read import delete_topics_by_prefix
from tokentrail.settings import Settings

from .stream_rig import StreamRig, make_rig


@pytest.fixture
def make_stream_rig(kafka_bootstrap: str, tokentrail_settings: Settings,
                    tmp_path: Path) -> Iterator[Callable[..., StreamRig]]:
    """``make_stream_rig(kafka_overrides=None, **processor_settings) -> StreamRig``; workers stopped, topics
    deleted after."""
    rigs: list[StreamRig] = []

    def make(kafka_overrides: dict[str, Any] | None = None, **overrides: Any) -> StreamRig:
        rig = make_rig(tokentrail_settings, tmp_path / f"rig{len(rigs)}", kafka_overrides, **overrides)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.close()
        delete_topics_by_prefix(admin_config(rig.settings.kafka),
                                [rig.topics.prefix, f"{rig.settings.processors.app_id}-"])
