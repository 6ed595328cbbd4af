"""Engine-area fixtures: the reference model, built once (cached in settings.model.dir) per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from producers.model_build import build_model
from producers.rendering import ChatRenderer
from tokentrail.settings import get_settings


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return build_model(get_settings().model.dir)


@pytest.fixture(scope="session")
def renderer(model_dir: Path) -> ChatRenderer:
    return ChatRenderer(model_dir)
