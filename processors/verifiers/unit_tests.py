"""Unit-test runner: run the Python code in the model's output against tests from the task input.

The code is the last fenced code block of the final output (```python / ```py / ```), else the whole
text. Tests come from the task input (``tests_field``): a list of code snippets (each one test), or
one string — each ``test_*`` function it defines is a test, or, with none, the string is one test.
Optional ``setup_field`` code runs before the solution (imports, fixtures).

Everything runs in a separate interpreter (``python -I``) in a fresh temporary directory, with no
stdin, a CPU/memory limit and a wall-clock limit (the whole process group is killed). The raw output
counts passed tests and keeps each test's error; paths of the sandbox are replaced by ``<sandbox>``
so the same code gives the same raw output.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from processors.jsonutil import get_path
from processors.verifiers.base import RolloutVerifier, RolloutView

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
STDERR_TAIL = 2000

# Runs inside the sandbox. Writes one JSON line per event to the real stdout; the solution's own
# prints go to stderr so they cannot forge results.
HARNESS = r'''
import json, resource, sys
limits = json.load(open("limits.json"))
resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"], limits["memory_bytes"]))
resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
out = sys.stdout
sys.stdout = sys.stderr

def report(**fields):
    out.write(json.dumps(fields) + "\n")
    out.flush()

def describe(exc):
    text = f"{type(exc).__name__}: {exc}"
    return text[:500]

spec = json.load(open("tests.json"))
ns = {"__name__": "solution", "__builtins__": __builtins__}
try:
    if spec["setup"]:
        exec(compile(spec["setup"], "setup.py", "exec"), ns)
    exec(compile(open("solution.py").read(), "solution.py", "exec"), ns)
except BaseException as exc:
    report(kind="load", ok=False, error=describe(exc))
    raise SystemExit(0)
report(kind="load", ok=True)

def run(name, code):
    env = dict(ns)
    try:
        exec(compile(code, name + ".py", "exec"), env)
        report(kind="test", name=name, ok=True)
    except BaseException as exc:
        report(kind="test", name=name, ok=False, error=describe(exc))

if spec["mode"] == "list":
    for i, code in enumerate(spec["items"]):
        run(f"test_{i}", code)
else:
    module = dict(ns)
    try:
        exec(compile(spec["items"][0], "tests.py", "exec"), module)
    except BaseException as exc:
        report(kind="test", name="tests", ok=False, error=describe(exc))
        raise SystemExit(0)
    names = sorted(k for k, v in module.items() if k.startswith("test") and callable(v) and k not in ns)
    if not names:
        report(kind="test", name="tests", ok=True)
    for name in names:
        try:
            module[name]()
            report(kind="test", name=name, ok=True)
        except BaseException as exc:
            report(kind="test", name=name, ok=False, error=describe(exc))
'''


class UnitTestOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tests_field: str = "tests"
    setup_field: str = "setup"
    time_limit_s: float = Field(default=10.0, gt=0)
    memory_mb: int = Field(default=1024, ge=64)
    python: str = ""  # interpreter; default: the one running the processors


def extract_code(text: str) -> str:
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


class UnitTests(RolloutVerifier):
    name: ClassVar[str] = "unit_tests"
    version: ClassVar[str] = "1.0"
    Options = UnitTestOptions
    default_timeout_s: ClassVar[float] = 30.0

    def verify(self, view: RolloutView) -> dict[str, Any]:
        opts: UnitTestOptions = self.options  # type: ignore[assignment]
        tests = get_path(view.task_input, opts.tests_field, None)
        if tests is None:
            raise ValueError(f"task input has no tests at {opts.tests_field!r}")
        if isinstance(tests, str):
            spec = {"mode": "module", "items": [tests]}
        elif isinstance(tests, list) and all(isinstance(t, str) for t in tests):
            spec = {"mode": "list", "items": tests}
        else:
            raise ValueError("tests must be a string of test code or a list of code strings")
        setup = get_path(view.task_input, opts.setup_field, "") or ""
        spec["setup"] = str(setup)
        return run_sandboxed(extract_code(view.final_output_text), spec, opts)


def run_sandboxed(code: str, spec: dict[str, Any], opts: UnitTestOptions) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tokentrail-tests-") as tmp:
        root = Path(tmp)
        (root / "solution.py").write_text(code)
        (root / "tests.json").write_text(json.dumps(spec))
        (root / "harness.py").write_text(HARNESS)
        cpu_s = max(1, int(opts.time_limit_s) + 1)
        limits = {"memory_bytes": opts.memory_mb * 2**20, "cpu_s": cpu_s}
        (root / "limits.json").write_text(json.dumps(limits))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONHASHSEED": "0",
               "PYTHONDONTWRITEBYTECODE": "1", "HOME": tmp, "LC_ALL": "C.UTF-8"}
        proc = subprocess.Popen([opts.python or sys.executable, "-I", "harness.py"], cwd=tmp, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        timed_out = False
        try:
            stdout, stderr = proc.communicate(timeout=opts.time_limit_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            stdout, stderr = proc.communicate()
        finally:
            _kill_group(proc)  # children the solution left behind
    stderr_text = stderr.decode(errors="replace").replace(tmp, "<sandbox>")
    return _summarize(stdout.decode(errors="replace"), stderr_text, proc.returncode, timed_out, spec)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _summarize(stdout: str, stderr: str, exit_code: int | None, timed_out: bool,
               spec: dict[str, Any]) -> dict[str, Any]:
    events = []
    for line in stdout.splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    load = next((e for e in events if e.get("kind") == "load"), None)
    results = [{"name": e["name"], "passed": bool(e["ok"]), "error": e.get("error")}
               for e in events if e.get("kind") == "test"]
    total = len(spec["items"]) if spec["mode"] == "list" else max(len(results), 1)
    passed = sum(r["passed"] for r in results)
    return {"passed": passed, "total": total, "pass_rate": passed / total if total else 0.0,
            "all_passed": passed == total and not timed_out, "timed_out": timed_out,
            "loaded": bool(load and load.get("ok")), "load_error": load.get("error") if load else None,
            "results": results, "exit_code": exit_code, "stderr_tail": stderr[-STDERR_TAIL:]}
