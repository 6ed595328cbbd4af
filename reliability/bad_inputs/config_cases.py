"""Configurations that must be refused with a typed ConfigError, and verifiers that crash, hang or die."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class ConfigCase:
    """``kind`` names the loader: reward | credit | sample | grouping (processors.config.load_config on
    YAML text or a path) or verifier (processors.verifiers.load_verifiers on a list of specs)."""

    id: str
    klass: str
    what: str
    kind: Literal["reward", "credit", "sample", "grouping", "verifier", "reward_file"]
    source: Any
    contains: str  # substring of the ConfigError message


@dataclass(frozen=True)
class VerifierCase:
    """A misbehaving verifier run on a real rollout: the Score's status and an error substring."""

    id: str
    klass: str
    what: str
    spec: str | dict[str, Any]
    status: Literal["ERROR", "TIMEOUT"]
    contains: str


GOOD_REWARD = "metrics: [{name: correct, verifier: answer_match, path: score}]\n"


def config_cases() -> list[ConfigCase]:
    def c(id_: str, klass: str, what: str, kind: Any, source: Any, contains: str) -> ConfigCase:
        return ConfigCase(f"config.{id_}", klass, what, kind, source, contains)

    rw = "invalid reward YAML"
    return [
        c("reward.not_yaml", rw, "unbalanced brackets", "reward", "metrics: [\n  {name: x\n", "not valid YAML"),
        c("reward.top_level_list", rw, "a list at the top level", "reward", "- 1\n- 2\n", "expected a mapping"),
        c("reward.no_metrics", rw, "no metrics", "reward", "name: x\ncombine: min\n", "metrics"),
        c("reward.empty_metrics", rw, "metrics: []", "reward", "metrics: []\n", "metrics"),
        c("reward.unknown_field", rw, "a misspelt key", "reward", GOOD_REWARD + "normalise: {method: grpo}\n",
          "normalise"),
        c("reward.combine", rw, "combine: avg", "reward", GOOD_REWARD + "combine: avg\n", "combine"),
        c("reward.normalize_method", rw, "normalize.method: zscore", "reward",
          GOOD_REWARD + "normalize: {method: zscore}\n", "normalize.method"),
        c("reward.clip_reversed", rw, "clip [5, -5]", "reward", GOOD_REWARD + "clip: [5, -5]\n", "clip"),
        c("reward.duplicate_metric", rw, "two metrics with one name", "reward",
          "metrics: [{name: a, verifier: v}, {name: a, verifier: w}]\n", "unique"),
        c("reward.std_ddof", rw, "std_ddof 2", "reward", GOOD_REWARD + "normalize: {std_ddof: 2}\n", "std_ddof"),
        c("reward.on_error", rw, "on_error: explode", "reward",
          "metrics: [{name: a, verifier: v, on_error: explode}]\n", "on_error"),
        c("reward.weight_word", rw, "weight: heavy", "reward", "metrics: [{name: a, verifier: v, weight: heavy}]\n",
          "weight"),
        c("reward.version_2", rw, "format version 2", "reward", GOOD_REWARD + "version: 2\n", "version"),
        c("reward.negative_eps", rw, "zero_variance_eps -1", "reward",
          GOOD_REWARD + "filters: {zero_variance_eps: -1}\n", "zero_variance_eps"),
        c("reward.missing_file", rw, "a path that does not exist", "reward_file",
          "/nonexistent/tokentrail/reward.yaml", "cannot read"),
        c("credit.level", "invalid credit YAML", "level: episode", "credit", "level: episode\n", "level"),
        c("credit.discount_zero", "invalid credit YAML", "call_discount 0", "credit", "call_discount: 0\n",
          "call_discount"),
        c("credit.discount_above_one", "invalid credit YAML", "token_discount 1.5", "credit",
          "token_discount: 1.5\n", "token_discount"),
        c("credit.weighting", "invalid credit YAML", "weighting: whatever", "credit", "weighting: whatever\n",
          "weighting"),
        c("credit.negative_weight", "invalid credit YAML", "rollout_weight -1", "credit", "rollout_weight: -1\n",
          "rollout_weight"),
        c("credit.unknown_field", "invalid credit YAML", "a misspelt key", "credit", "levle: rollout\n", "levle"),
        c("sample.pack_zero", "invalid sample YAML", "pack.max_tokens 0", "sample", "pack: {max_tokens: 0}\n",
          "pack.max_tokens"),
        c("sample.negative_max", "invalid sample YAML", "max_sample_tokens -1", "sample",
          "max_sample_tokens: -1\n", "max_sample_tokens"),
        c("sample.merge_word", "invalid sample YAML", "merge: perhaps", "sample", "merge: perhaps\n", "merge"),
        c("sample.unknown_field", "invalid sample YAML", "a misspelt key", "sample", "packing: true\n", "packing"),
        c("sample.not_mapping", "invalid sample YAML", "a bare number", "sample", "42\n", "expected a mapping"),
        c("grouping.fallback", "invalid grouping YAML", "fallback: group", "grouping", "fallback: group\n",
          "fallback"),
        c("grouping.window_zero", "invalid grouping YAML", "window_s 0", "grouping", "window_s: 0\n", "window_s"),
        c("verifier.no_colon", "unknown verifier import path", "'module.Class' instead of 'module:Class'",
          "verifier", ["processors.verifiers.answer_match.AnswerMatch"], "not 'module:Class'"),
        c("verifier.no_module", "unknown verifier import path", "a module that does not exist", "verifier",
          ["processors.no_such_module:Thing"], "cannot import"),
        c("verifier.no_class", "unknown verifier import path", "a class the module lacks", "verifier",
          ["testkit.stages:NoSuchVerifier"], "not a Verifier subclass"),
        c("verifier.not_verifier", "unknown verifier import path", "a class that is not a Verifier", "verifier",
          ["testkit.stages:Turn"], "not a Verifier subclass"),
        c("verifier.spec_unknown_key", "unknown verifier import path", "a spec with an unknown key", "verifier",
          [{"ref": "processors.verifiers.answer_match:AnswerMatch", "retries": 3}], "needs 'ref'"),
        c("verifier.bad_option", "unknown verifier import path", "an option the verifier does not have",
          "verifier", [{"ref": "processors.verifiers.answer_match:AnswerMatch", "options": {"strictness": 9}}],
          "bad options"),
        c("verifier.timeout_zero", "unknown verifier import path", "timeout_s 0", "verifier",
          [{"ref": "processors.verifiers.answer_match:AnswerMatch", "timeout_s": 0}], "timeout_s"),
        c("verifier.isolation", "unknown verifier import path", "isolation: container", "verifier",
          [{"ref": "processors.verifiers.answer_match:AnswerMatch", "isolation": "container"}], "isolation"),
        c("verifier.duplicate", "unknown verifier import path", "the same verifier twice", "verifier",
          ["processors.verifiers.answer_match:AnswerMatch"] * 2, "unique"),
    ]


def verifier_cases() -> list[VerifierCase]:
    return [
        VerifierCase("verifier.crash", "verifier crash", "verify() raises", "testkit.stages:CrashingVerifier",
                     "ERROR", "verifier bug"),
        VerifierCase("verifier.crash_in_process", "verifier crash", "verify() raises in an isolated process",
                     {"ref": "testkit.stages:CrashingVerifier", "isolation": "process"}, "ERROR", "verifier bug"),
        VerifierCase("verifier.process_exit", "verifier crash", "the verifier's process exits (like a segfault)",
                     {"ref": "testkit.stages:ExitingVerifier", "isolation": "process"}, "ERROR", "died"),
        VerifierCase("verifier.nan", "verifier crash", "returns NaN (not JSON)", "testkit.stages:NaNVerifier",
                     "ERROR", "no exact JSON form"),
        VerifierCase("verifier.timeout", "verifier timeout", "sleeps past its time limit (thread)",
                     "testkit.stages:SleepingVerifier", "TIMEOUT", "did not return"),
        VerifierCase("verifier.timeout_process", "verifier timeout", "sleeps past its time limit (process, killed)",
                     {"ref": "testkit.stages:SleepingVerifier", "isolation": "process", "timeout_s": 0.5},
                     "TIMEOUT", "killed"),
    ]
