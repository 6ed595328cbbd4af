"""The ``model`` settings section (``TOKENTRAIL_MODEL__*``): where the reference model lives."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from schemas.local_paths import VAR_DIR


class ModelSettings(BaseModel):
    # The embedded reference model (built locally, random weights; `tokentrail model build`).
    dir: Path = VAR_DIR / "models" / "tiny-chat"
    name: str = "tokentrail-tiny"
