"""Run the configuration and verifier cases of the corpus (in process: they are pure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from processors.config import load_config
from processors.credit import CreditConfig
from processors.errors import ConfigError
from processors.grouper import GroupingConfig
from processors.isolation.calls import verifier_runner
from processors.rewards import RewardConfig
from processors.samples import SampleConfig
from processors.verifiers import load_verifiers
from processors.verifiers.base import load_verifier
from reliability.bad_inputs.config_cases import ConfigCase, VerifierCase, config_cases, verifier_cases
from reliability.results import CaseResult

MODELS: dict[str, Any] = {"reward": RewardConfig, "credit": CreditConfig, "sample": SampleConfig,
                          "grouping": GroupingConfig}


def _load(case: ConfigCase) -> Any:
    if case.kind == "verifier":
        return load_verifiers(case.source)
    if case.kind == "reward_file":
        return load_config(RewardConfig, Path(case.source))
    return load_config(MODELS[case.kind], case.source)


def run_config_case(case: ConfigCase) -> CaseResult:
    def result(ok: bool, detail: str = "") -> CaseResult:
        return CaseResult(case.id, "config", case.klass, case.what, ok, detail)

    try:
        loaded = _load(case)
    except ConfigError as exc:
        if case.contains not in str(exc):
            return result(False, f"ConfigError does not mention {case.contains!r}: {exc}")
        return result(True)
    except Exception as exc:  # any other exception type is an untyped failure
        return result(False, f"{type(exc).__name__} instead of ConfigError: {exc}")
    return result(False, f"accepted: {loaded!r}"[:300])


def _rollout_and_group() -> tuple[dict[str, Any], dict[str, Any]]:
    import numpy as np

    from testkit.stages import AttemptSpec, assemble, full_group, growing_turns

    turns = growing_turns(np.random.default_rng(3), 2, 16, 4, 4, vocab=900, texts=["x", "4"])
    rollout = assemble(AttemptSpec("verifier-case", "a1", turns, task_input={"answer": "4"}))
    return rollout, full_group([rollout], "verifier-case")


def run_verifier_case(case: VerifierCase) -> CaseResult:
    def result(ok: bool, detail: str = "") -> CaseResult:
        return CaseResult(case.id, "verifier", case.klass, case.what, ok, detail)

    rollout, group = _rollout_and_group()
    try:
        verifier = load_verifier(case.spec)
        (score,) = verifier_runner().score_rollouts(verifier, [rollout], group)
    except Exception as exc:  # the runner must turn every verifier failure into a Score
        return result(False, f"escaped the runner: {type(exc).__name__}: {exc}")
    if score["status"] != case.status:
        return result(False, f"score status {score['status']}, expected {case.status}: {score['error']}")
    if case.contains not in (score["error"] or ""):
        return result(False, f"score error does not mention {case.contains!r}: {score['error']}")
    if score["raw_json"] != "null":
        return result(False, f"a failed verifier left a raw value {score['raw_json']}")
    return result(True)


def run_config_corpus() -> list[CaseResult]:
    return [run_config_case(c) for c in config_cases()] + [run_verifier_case(c) for c in verifier_cases()]
