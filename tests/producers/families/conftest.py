"""Model families (models/families): each family's model directory, built once per machine (cached in
settings ``model.families_dir``), its gateway text side, and a gateway on the embedded engine serving it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from testkit.gateway import RunningGateway, running_embedded_gateway
from tokentrail.settings import Settings

from .family_models import family_settings, family_text_side


@pytest.fixture
def topics(kafka_bootstrap: str, new_topic: Callable[..., str]) -> dict[str, str]:
    return {"calls_topic": new_topic(partitions=1), "env_topic": new_topic(partitions=1)}


@pytest.fixture
def start_family_gateway(kafka_bootstrap: str, tokentrail_settings: Settings, topics: dict[str, str],
                         tmp_path: Path) -> Callable[..., Any]:
    """``with start_family_gateway("qwen3") as gw:`` a gateway on the embedded engine serving the family."""

    @contextmanager
    def start(family: str, **options: Any) -> Iterator[RunningGateway]:
        spool = tmp_path / f"spool-{family}"
        with running_embedded_gateway(family_settings(tokentrail_settings, family), spool_dir=spool, topics=topics,
                                      text=family_text_side(family), **options) as gw:
            yield gw

    return start
