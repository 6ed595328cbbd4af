"""The families' model directories: built once per machine where the settings keep them (the families tests'
own helper, tests/producers/families/family_models.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.producers.families.family_models import family_dir as built_family_dir


@pytest.fixture(scope="session")
def family_dir() -> Callable[[str], Path]:
    return built_family_dir
