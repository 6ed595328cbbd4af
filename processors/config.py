"""Loading versioned YAML configurations (reward, credit, sample, grouping) with clear errors.

A configuration's id is the content hash of its normalized content (every field, defaults filled
in, as JSON), so formatting, key order and spelled-out defaults do not change it, and any change of
meaning does. A field added later is left out while at a default that keeps the old meaning (the
model's ``ID_OMITS_DEFAULTS``), so the ids on stored records keep naming the same configuration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from processors.errors import ConfigError
from schemas.ids import content_hash

M = TypeVar("M", bound=BaseModel)


def config_id(config: BaseModel) -> str:
    data = config.model_dump(mode="json")
    # A field added later whose default keeps the old meaning (named by the model's ID_OMITS_DEFAULTS) is left
    # out while at its default: configurations written before it keep their ids.
    for name in getattr(type(config), "ID_OMITS_DEFAULTS", ()):
        if data.get(name) == type(config).model_fields[name].default:
            del data[name]
    return content_hash(data)


def _format(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  {where}: {err['msg']}")
    return "\n".join(lines)


def parse_config(model: type[M], data: Any, source: str = "config") -> M:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source} is not a valid {model.__name__}:\n{_format(exc)}") from exc


def load_config(model: type[M], source: str | Path | dict[str, Any] | M) -> M:
    """A config from a YAML file path, YAML text, a dict, or an already validated model."""
    if isinstance(source, model):
        return source
    if isinstance(source, dict):
        return parse_config(model, source, f"{model.__name__} mapping")
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source and source.endswith(
            (".yaml", ".yml"))):
        path = Path(source)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read {model.__name__} file {path}: {exc}") from exc
        return parse_config(model, _yaml(text, str(path)), str(path))
    return parse_config(model, _yaml(str(source), "YAML text"), "YAML text")


def _yaml(text: str, source: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}") from exc
