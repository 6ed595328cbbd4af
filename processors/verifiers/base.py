"""The verifier plugin interface.

A verifier is a class loaded by import path ``"module:Class"`` with options; it has a ``name``, a
``version`` and a ``scope``:
  * ROLLOUT scope: ``verify(view) -> raw`` for one rollout;
  * GROUP scope: ``verify_group(views, prior) -> {rollout_id: raw}`` (or a list in ``views`` order)
    for a whole group; ``prior`` holds the raw outputs of the rollout-scope verifiers that ran
    first, so a group verifier can rank rollouts by another verifier's metric.
The raw return value must be JSON-serializable; it is stored exactly (canonical JSON) in a Score.
Exceptions and time-outs never escape: the runner turns them into ERROR / TIMEOUT scores.

Options are validated by the class's ``Options`` pydantic model when the verifier is loaded, so a
bad option is a start-up error, not a stream of ERROR scores.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from processors.call_tokens import sampled_token_count
from processors.errors import ConfigError
from processors.jsonutil import canonical_json, loads_object
from schemas.ids import content_hash

Record = dict[str, Any]


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class RolloutView:
    """What a verifier sees of a rollout: parsed task input and artifacts, the final output text."""

    rollout_id: str
    rollout_event_id: str
    task_input: dict[str, Any]
    final_output_text: str
    final_artifacts: dict[str, Any]
    sampled_tokens: int
    rollout: Record  # the CompletedRollout itself, for verifiers that need more

    @classmethod
    def of(cls, rollout: Record) -> RolloutView:
        return cls(rollout_id=rollout["rollout_id"], rollout_event_id=rollout["event_id"],
                   task_input=_lenient_object(rollout.get("task_input_json", "")),
                   final_output_text=rollout.get("final_output_text", ""),
                   final_artifacts=_lenient_object(rollout.get("final_artifacts_json", "")),
                   sampled_tokens=sampled_token_count(rollout),
                   rollout=rollout)


def _lenient_object(text: str) -> dict[str, Any]:
    try:
        return loads_object(text, "json field")
    except ValueError:
        return {"_raw": text}


class Verifier:
    """Base of every verifier. Subclasses set ``name``, ``version`` and override one method."""

    name: ClassVar[str] = ""
    version: ClassVar[str] = ""
    scope: ClassVar[str] = "ROLLOUT"
    Options: ClassVar[type[BaseModel]] = NoOptions
    # Runner defaults; a spec can override them.
    default_timeout_s: ClassVar[float] = 10.0
    default_isolation: ClassVar[str] = "thread"

    def __init__(self, **options: Any) -> None:
        try:
            self.options = self.Options(**options)
        except ValidationError as exc:
            raise ConfigError(f"verifier {self.name or type(self).__name__}: bad options: {exc}") from exc
        self.raw_options: dict[str, Any] = dict(options)
        self.ref = f"{type(self).__module__}:{type(self).__qualname__}"
        self.timeout_s = self.default_timeout_s
        self.isolation = self.default_isolation

    @cached_property
    def version_tag(self) -> str:
        """The version stored with each score: the class version, plus a hash of non-default options."""
        opts = self.options.model_dump(mode="json", exclude_defaults=True)
        return self.version if not opts else f"{self.version}+o{content_hash(opts)[:8]}"

    def verify(self, view: RolloutView) -> Any:  # ROLLOUT scope
        raise NotImplementedError

    def verify_group(self, views: list[RolloutView],
                     prior: dict[str, dict[str, Any]]) -> dict[str, Any] | list[Any]:  # GROUP scope
        raise NotImplementedError


class RolloutVerifier(Verifier):
    scope: ClassVar[str] = "ROLLOUT"


class GroupVerifier(Verifier):
    scope: ClassVar[str] = "GROUP"


def load_verifier(ref: str | dict[str, Any], **options: Any) -> Verifier:
    """Instantiate ``"module:Class"`` (or ``{"ref": ..., "options": {...}, "timeout_s": ...,
    "isolation": "thread"|"process"}``) with options; raises ConfigError with the reason."""
    timeout_s = isolation = None
    if isinstance(ref, dict):
        spec = dict(ref)
        unknown = set(spec) - {"ref", "options", "timeout_s", "isolation"}
        if unknown or "ref" not in spec:
            raise ConfigError("verifier spec needs 'ref' and may have options/timeout_s/isolation; "
                              f"got {spec}")
        options = {**spec.get("options", {}), **options}
        timeout_s, isolation, ref = spec.get("timeout_s"), spec.get("isolation"), spec["ref"]
    module_name, _, attr = str(ref).partition(":")
    if not module_name or not attr:
        raise ConfigError(f"verifier reference {ref!r} is not 'module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"verifier {ref!r}: cannot import {module_name}: {exc}") from exc
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Verifier)):
        raise ConfigError(f"verifier {ref!r}: {attr} is not a Verifier subclass in {module_name}")
    if not cls.name or not cls.version or cls.scope not in ("ROLLOUT", "GROUP"):
        raise ConfigError(f"verifier {ref!r} must define name, version and scope ROLLOUT|GROUP")
    verifier = cls(**options)
    if timeout_s is not None:
        if float(timeout_s) <= 0:
            raise ConfigError(f"verifier {ref!r}: timeout_s must be > 0")
        verifier.timeout_s = float(timeout_s)
    if isolation is not None:
        if isolation not in ("thread", "process"):
            raise ConfigError(f"verifier {ref!r}: isolation must be 'thread' or 'process'")
        verifier.isolation = isolation
    return verifier


def load_verifiers(specs: list[str | dict[str, Any]]) -> list[Verifier]:
    verifiers = [load_verifier(s) for s in specs]
    names = [v.name for v in verifiers]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"verifier names must be unique; repeated: {dupes}")
    return verifiers


def options_json(verifier: Verifier) -> str:
    return canonical_json(verifier.options.model_dump(mode="json"))


def load_verifiers_file(path: str) -> list[Verifier]:
    """Verifiers from a YAML list of specs (strings or mappings), e.g. deploy/config/verifiers.yaml."""
    import yaml

    try:
        with open(path) as fh:
            specs = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read verifier list {path}: {exc}") from exc
    if not isinstance(specs, list):
        raise ConfigError(f"{path}: expected a list of verifier specs")
    return load_verifiers(specs)
