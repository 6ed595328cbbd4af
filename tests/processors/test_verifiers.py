"""Verifiers: plugin loading, crash / time-out capture, answer match, unit tests, group-relative ones."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from processors.errors import ConfigError
from processors.isolation.calls import verifier_runner
from processors.isolation.unit_tests import extract_code
from processors.verifiers import RolloutView, load_verifier, load_verifiers
from processors.verifiers.base import load_verifiers_file
from processors.verifiers.extract import extract_answer, parse_number

T0 = 1_700_000_000_000_000


def rollout(rid: str, text: str, task: dict[str, Any] | None = None, artifacts: dict[str, Any] | None = None,
            tokens: int = 4) -> dict[str, Any]:
    return {"event_id": f"ev-{rid}", "rollout_id": rid, "status": "COMPLETE",
            "task_input_json": json.dumps(task or {}), "final_output_text": text,
            "final_artifacts_json": json.dumps(artifacts or {}), "created_at_us": T0,
            "calls": [{"status": "OK", "output_ids": b"\x00" * 4 * tokens}]}


GROUP = {"event_id": "group-ev", "group_id": "g", "status": "FULL", "created_at_us": T0 + 1}
FIXED = verifier_runner(timer=lambda: 0.0)


def score(spec: str | dict, r: dict[str, Any], **options: Any) -> dict[str, Any]:
    verifier = load_verifier(spec, **options)
    (s,) = FIXED.score_rollouts(verifier, [r], GROUP)
    return s


def raw(s: dict[str, Any]) -> Any:
    assert s["status"] == "OK", s["error"]
    return json.loads(s["raw_json"])


# ----------------------------------------------------------------------------------- answer match

AM = "processors.verifiers.answer_match:AnswerMatch"


@pytest.mark.parametrize(("text", "answer", "options", "correct"), [
    ("so the result is \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", {}, True),
    ("The answer is 1,234.", "1234", {}, True),
    ("The answer is 1234.0000001", "1234", {}, True),
    ("The answer is 1235", "1234", {}, False),
    ("Final answer: 3/4", "0.75", {}, True),
    ("<answer> Paris </answer>", "paris", {}, True),
    ("<answer> Paris </answer>", "paris", {"case_sensitive": True}, False),
    ("answer: x = 42 apples", "42", {"mode": "numeric"}, True),
    ("Answer: yes", ["no", "yes"], {}, True),
    ("Answer: ABC-123", "[A-Z]{3}-\\d+", {"mode": "regex"}, True),
    ("Answer: ABC-12x", "[A-Z]{3}-\\d+", {"mode": "regex"}, False),
])
def test_answer_match_modes(text: str, answer: Any, options: dict[str, Any], correct: bool) -> None:
    out = raw(score(AM, rollout("r", text, {"answer": answer}), **options))
    assert out["correct"] is correct and out["score"] == (1.0 if correct else 0.0)


def test_answer_match_per_task_mode_nested_field_and_artifact_source() -> None:
    task = {"meta": {"gold": "A.*Z"}, "answer_mode": "regex"}
    assert raw(score(AM, rollout("r", "Answer: ABCZ", task), answer_field="meta.gold"))["mode"] == "regex"
    r = rollout("r", "nothing useful", {"answer": "7"}, artifacts={"result": {"value": 7}})
    assert raw(score(AM, r, source="artifact:result.value"))["correct"] is True


def test_answer_match_without_an_expected_answer_is_an_error_score() -> None:
    s = score(AM, rollout("r", "Answer: 1", {"question": "?"}))
    assert s["status"] == "ERROR" and "no expected answer" in s["error"] and s["raw_json"] == "null"


def test_extractors() -> None:
    assert extract_answer("x \\boxed{a{b}c} y \\boxed{d}") == "d"
    assert extract_answer("line one\nlast line\n") == "last line"
    assert extract_answer("3 apples and -4.5e2 pears", "last_number") == "-4.5e2"
    assert parse_number("50%") == 50.0 and parse_number("1/0") is None and parse_number("abc") is None


# ----------------------------------------------------------------------------------- runner


def test_crashing_verifier_gives_an_error_score_with_the_traceback() -> None:
    s = score("testkit.stages:CrashingVerifier", rollout("r1", ""))
    assert s["status"] == "ERROR" and "RuntimeError: verifier bug on r1" in s["error"]
    assert s["verifier_name"] == "crashes" and s["scope"] == "ROLLOUT" and s["created_at_us"] == T0


def test_hanging_verifier_times_out_in_a_thread() -> None:
    started = time.perf_counter()
    s = score("testkit.stages:SleepingVerifier", rollout("r1", ""))
    assert s["status"] == "TIMEOUT" and "0.2s" in s["error"]
    assert time.perf_counter() - started < 5


def test_process_isolation_kills_a_hanging_verifier_and_survives_a_dying_one() -> None:
    hang = score({"ref": "testkit.stages:SleepingVerifier", "isolation": "process", "timeout_s": 1.0},
                 rollout("r1", ""))
    assert hang["status"] == "TIMEOUT" and "killed" in hang["error"]
    died = score({"ref": "testkit.stages:ExitingVerifier", "isolation": "process", "timeout_s": 20},
                 rollout("r1", ""))
    assert died["status"] == "ERROR" and "exit code 3" in died["error"]
    ok = score({"ref": AM, "isolation": "process", "timeout_s": 20},
               rollout("r1", "Answer: 2", {"answer": 2}))
    assert raw(ok)["correct"] is True


def test_output_without_an_exact_json_form_is_an_error() -> None:
    s = score("testkit.stages:NaNVerifier", rollout("r1", ""))
    assert s["status"] == "ERROR" and "no exact JSON form" in s["error"]


def test_raw_output_is_stored_as_canonical_json() -> None:
    s = score("testkit.stages:ConstantVerifier", rollout("r1", "", {"score": {"b": [1, 2.5], "a": "é"}}))
    assert s["raw_json"] == '{"a":"é","b":[1,2.5]}'


def test_score_ids_depend_on_what_was_scored_not_on_the_outcome() -> None:
    r = rollout("r1", "Answer: 1", {"answer": "1"})
    first, second = score(AM, r), score(AM, r)
    assert first == second
    assert score(AM, r, rel_tol=0.1)["event_id"] != first["event_id"]  # options change the version tag
    assert score(AM, r, rel_tol=0.1)["verifier_version"].startswith("1.0+o")


def test_loading_errors_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="not 'module:Class'"):
        load_verifier("processors.verifiers.answer_match")
    with pytest.raises(ConfigError, match="cannot import"):
        load_verifier("no_such_module:X")
    with pytest.raises(ConfigError, match="not a Verifier subclass"):
        load_verifier("processors.verifiers.answer_match:AnswerMatchOptions")
    with pytest.raises(ConfigError, match="bad options"):
        load_verifier(AM, mode="fuzzy")
    with pytest.raises(ConfigError, match="unique"):
        load_verifiers([AM, AM])
    with pytest.raises(ConfigError, match="isolation"):
        load_verifier({"ref": AM, "isolation": "vm"})


def test_default_verifier_list_loads() -> None:
    names = [v.name for v in load_verifiers_file("deploy/config/verifiers.yaml")]
    assert names == ["answer_match", "group_rank"]


# ----------------------------------------------------------------------------------- unit tests

UT = "processors.isolation.unit_tests:UnitTests"
SOLUTION = "Here you go:\n```python\ndef add(a, b):\n    return a + b\nprint('noise')\n```\n"


def test_unit_tests_pass_and_fail_per_test() -> None:
    task = {"tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 5", "assert add('a', 'b') == 'ab'"]}
    out = raw(score(UT, rollout("r", SOLUTION, task)))
    assert (out["passed"], out["total"], out["all_passed"], out["loaded"]) == (2, 3, False, True)
    assert out["results"][1] == {"name": "test_1", "passed": False, "error": "AssertionError: "}
    assert "noise" in out["stderr_tail"]  # the solution's prints cannot forge result lines


def test_unit_tests_module_with_test_functions_and_setup() -> None:
    task = {"setup": "import math", "tests": "def test_a():\n    assert add(1, 1) == 2\n"
            "def test_b():\n    assert math.isclose(add(0.1, 0.2), 0.3)\n"}
    out = raw(score(UT, rollout("r", SOLUTION, task)))
    assert [r["name"] for r in out["results"]] == ["test_a", "test_b"] and out["all_passed"]


def test_unit_tests_time_limit_and_broken_code_are_reported_not_raised() -> None:
    loop = "```python\ndef add(a, b):\n    while True:\n        pass\n```"
    started = time.perf_counter()
    out = raw(score(UT, rollout("r", loop, {"tests": ["assert add(1, 2) == 3"]}), time_limit_s=1.0))
    assert out["timed_out"] and out["passed"] == 0 and not out["all_passed"]
    assert time.perf_counter() - started < 10
    broken = raw(score(UT, rollout("r", "```python\ndef add(:\n```", {"tests": ["assert True"]})))
    assert not broken["loaded"] and "SyntaxError" in broken["load_error"] and broken["passed"] == 0


def test_unit_tests_raw_output_is_reproducible() -> None:
    r = rollout("r", "```python\ndef add(a, b):\n    raise ValueError('x')\n```", {"tests": ["add(1, 2)"]})
    assert score(UT, r) == score(UT, r)


def test_extract_code_takes_the_last_fenced_block() -> None:
    assert extract_code("```py\na = 1\n```\ntext\n```python\nb = 2\n```") == "b = 2\n"
    assert extract_code("c = 3") == "c = 3"


# ----------------------------------------------------------------------------------- group scope


def test_group_rank_uses_prior_scores_and_features() -> None:
    runner = FIXED
    am, rank = load_verifier(AM), load_verifier("processors.verifiers.group_rank:GroupRank")
    rs = [rollout("r1", "Answer: 1", {"answer": "1"}, tokens=10), rollout("r2", "Answer: 2", {"answer": "1"}),
          rollout("r3", "Answer: 1", {"answer": "1"}, tokens=3)]
    from processors.verifiers import prior_raw

    scores = runner.score_rollouts(am, rs, GROUP)
    ranked = {s["rollout_id"]: raw(s) for s in runner.score_group(rank, rs, GROUP, prior_raw(scores))}
    assert ranked["r3"]["rank"] == 1 and ranked["r3"]["win_rate"] == 1.0  # correct and shortest
    assert ranked["r1"]["rank"] == 2 and ranked["r2"]["rank"] == 3 and ranked["r2"]["win_rate"] == 0.0
    s = runner.score_group(rank, rs, GROUP, {})[0]
    assert s["scope"] == "GROUP" and s["created_at_us"] == GROUP["created_at_us"]


def test_majority_vote() -> None:
    mv = load_verifier("processors.verifiers.group_rank:MajorityVote")
    rs = [rollout("r1", "Answer: 1,000"), rollout("r2", "Answer: 1000.0"), rollout("r3", "Answer: 7"),
          rollout("r4", "")]
    out = {s["rollout_id"]: raw(s) for s in FIXED.score_group(mv, rs, GROUP, {})}
    assert [out[r]["agrees"] for r in ("r1", "r2", "r3", "r4")] == [True, True, False, False]
    assert out["r1"]["share"] == 0.5 and out["r4"]["answer"] is None


def test_group_verifier_results_missing_for_some_rollouts_are_errors() -> None:
    pv = load_verifier("testkit.stages:PartialGroupVerifier")
    rs = [rollout("r1", ""), rollout("r2", "")]
    first, second = FIXED.score_group(pv, rs, GROUP, {})
    assert raw(first) == {"seen": 2}
    assert second["status"] == "ERROR" and "no result for rollout r2" in second["error"]


def test_rollout_view_parses_task_and_artifacts() -> None:
    view = RolloutView.of(rollout("r1", "t", {"a": 1}, {"b": 2}, tokens=5))
    assert (view.task_input, view.final_artifacts, view.sampled_tokens) == ({"a": 1}, {"b": 2}, 5)
    broken = dict(rollout("r1", ""), task_input_json="not json")
    assert RolloutView.of(broken).task_input == {"_raw": "not json"}
