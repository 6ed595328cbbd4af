"""The ``release`` settings section (``TOKENTRAIL_RELEASE__*``), read by ``tokentrail release`` and, later,
the release controller's worker."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from schemas.local_paths import DEPLOY_CONFIG_DIR


class ReleaseSettings(BaseModel):
    plan: Path = DEPLOY_CONFIG_DIR / "release.yaml"  # the plan a new release starts with
    model: str = ""  # the release track (the served model name); empty: model.name
    operator: str = ""  # who signs operators' decisions; empty: the login name
    read_timeout_s: float = Field(default=30.0, gt=0)  # reading the decisions topic to its end
    # Which rewards the controller compares versions on: the verifiers' or the feedback join's (never both).
    reward_source: Literal["verifier", "feedback"] = "verifier"
