"""The ``model`` settings section (``TOKENTRAIL_MODEL__*``): where the reference model lives."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from schemas.local_paths import VAR_DIR


class ModelSettings(BaseModel):
    # The embedded reference model (built locally, random weights; `tokentrail model build`).
    dir: Path = VAR_DIR / "models" / "tiny-chat"
    name: str = "tokentrail-tiny"
    # The harness variant (spec "harness": 16K vocabulary, 64K positions), where real harness prompts fit;
    # its own directory, so building it never replaces the demo's model.
    harness_dir: Path = VAR_DIR / "models" / "harness-chat"
    harness_name: str = "tokentrail-harness"
