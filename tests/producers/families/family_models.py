"""Each family's model directory, built once per machine (cached in settings ``model.families_dir``), its
gateway text side, and settings that serve it."""

from __future__ import annotations

from pathlib import Path

from models.families.build import build_family
from models.families.spec import family_named
from producers.gateway.family_text_side import FamilyTextSide
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
