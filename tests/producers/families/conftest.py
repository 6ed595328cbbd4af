"""Model families (models/families): each family's model directory, built once per machine (cached in
settings ``model.families_dir``), its gateway text side, and a gateway on the embedded engine serving it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from models.families.build import build_family
from models.families.spec import family_named
from producers.gateway.family_text_side import FamilyTextSide
from producers.gateway.testing import RunningGateway, running_embedded_gateway
from tokentrail.settings import Settings, get_settings

_TEXT_SIDES: dict[str, FamilyTextSide] = {}


def family_dir(family: str) -> Path:
    return build_family(get_settings().model.families_dir / family, family_named(family))


def family_text_side(family: str) -> FamilyTextSide:
    if family not in _TEXT_SIDES:
        _TEXT_SIDES[family] = FamilyTextSide.from_dir(family_dir(family))
    return _TEXT_SIDES[family]


def family_settings(settings: Settings, family: str) -> Settings:
    model = settings.model.model_copy(update={"dir": family_dir(family), "family": family, "name": family})
    return settings.model_copy(update={"model": model})


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
