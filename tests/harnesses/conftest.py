"""Fixtures of the harness tests: the harness model variant (spec ``harness``), built once and cached in
settings ``model.harness_dir``."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.reference.build import build_model
from models.reference.spec import HARNESS_SPEC
from tokentrail.settings import get_settings


@pytest.fixture(scope="session")
def harness_model_dir() -> Path:
    return build_model(get_settings().model.harness_dir, spec=HARNESS_SPEC)
