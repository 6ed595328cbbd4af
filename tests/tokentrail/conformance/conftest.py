"""The families' model directories (built once, where the settings keep them, shared with every other test)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from models.families.build import build_family
from models.families.spec import family_named
from tokentrail.settings import get_settings


@pytest.fixture(scope="session")
def family_dir() -> Callable[[str], Path]:
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = build_family(get_settings().model.families_dir / family, family_named(family))
        return built[family]

    return get
