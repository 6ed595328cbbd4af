"""Unit-test runner: run the Python code in the model's output against tests from the task input.

The code is the last fenced code block of the final output (```python / ```py / ```), else the whole
text. Tests come from the task input (``tests_field``): a list of code snippets (each one test), or
one string — each ``test_*`` function it defines is a test, or, with none, the string is one test.
Optional ``setup_field`` code runs before the solution (imports, fixtures).

Everything runs in the sandbox of ``processors/isolation/sandbox.py`` (its docstring has the design
and why): results come back on a separate pipe, each line authenticated with a per-run HMAC key the
solution never receives, so printing or writing fake result lines voids the run (``tampered``)
instead of passing it; no network (own network namespace), a fresh unprivileged uid, a clean
environment, a size-limited scratch tmpfs as working directory and limits on CPU, memory, processes,
file size, open files, wall clock and output bytes. A run that hits a limit is scored as failed with
the ``reason``; if the sandbox cannot be built the verifier raises (an ERROR score, fail closed)
unless ``require_namespaces`` is false. The raw output counts passed tests and keeps each test's
error; paths of the sandbox are replaced by ``<sandbox>`` so the same code gives the same raw output.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from processors.isolation import sandbox
from processors.jsonutil import get_path
from processors.verifiers.base import RolloutVerifier, RolloutView

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
STDERR_TAIL = 2000


class UnitTestOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tests_field: str = "tests"
    setup_field: str = "setup"
    time_limit_s: float = Field(default=10.0, gt=0)  # wall clock; CPU time limit: this + 1 s
    memory_mb: int = Field(default=1024, ge=64)  # address space
    max_processes: int = Field(default=32, ge=1)  # processes and threads of the run's uid
    max_file_mb: int = Field(default=16, ge=1)  # largest file the solution may write
    max_open_files: int = Field(default=64, ge=16)
    scratch_mb: int = Field(default=64, ge=1)  # tmpfs for the working directory, /tmp, /dev/shm
    max_output_kb: int = Field(default=1024, ge=1)  # stdout + stderr read; past it the run is stopped
    python: str = ""  # interpreter; default: the one running the processors
    user: str = Field(default="auto", min_length=1)  # "auto": a fresh unprivileged uid per run; or a user
    require_namespaces: bool = True  # false: run without network/PID/mount isolation when unavailable

    def limits(self) -> sandbox.Limits:
        return sandbox.Limits(time_s=self.time_limit_s, cpu_s=max(1, int(self.time_limit_s) + 1),
                              memory_bytes=self.memory_mb << 20, processes=self.max_processes,
                              file_bytes=self.max_file_mb << 20, open_files=self.max_open_files,
                              scratch_bytes=self.scratch_mb << 20, output_bytes=self.max_output_kb << 10)


def extract_code(text: str) -> str:
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


class UnitTests(RolloutVerifier):
    name: ClassVar[str] = "unit_tests"
    version: ClassVar[str] = "2.0"  # 2.0: the sandbox (authenticated results, isolation, limits)
    Options = UnitTestOptions
    default_timeout_s: ClassVar[float] = 30.0

    def verify(self, view: RolloutView) -> dict[str, Any]:
        opts: UnitTestOptions = self.options  # type: ignore[assignment]
        tests = get_path(view.task_input, opts.tests_field, None)
        if tests is None:
            raise ValueError(f"task input has no tests at {opts.tests_field!r}")
        if isinstance(tests, str):
            spec: dict[str, Any] = {"mode": "module", "items": [tests]}
        elif isinstance(tests, list) and all(isinstance(t, str) for t in tests):
            spec = {"mode": "list", "items": tests}
        else:
            raise ValueError("tests must be a string of test code or a list of code strings")
        setup = get_path(view.task_input, opts.setup_field, "") or ""
        spec["setup"] = str(setup)
        return run_sandboxed(extract_code(view.final_output_text), spec, opts)


def run_sandboxed(code: str, spec: dict[str, Any], opts: UnitTestOptions) -> dict[str, Any]:
    """Run the tests in the sandbox; raises sandbox.SandboxUnavailable when it cannot be built."""
    run = sandbox.run(code, spec, opts.limits(), python=opts.python, user=opts.user,
                      require_namespaces=opts.require_namespaces)
    return _summarize(run, spec)


def _summarize(run: sandbox.SandboxRun, spec: dict[str, Any]) -> dict[str, Any]:
    events = [] if run.tampered else run.events
    load = next((e for e in events if e.get("kind") == "load"), None)
    results = [{"name": e["name"], "passed": bool(e["ok"]), "error": e.get("error")}
               for e in events if e.get("kind") == "test"]
    total = len(spec["items"]) if spec["mode"] == "list" else max(len(results), 1)
    passed = sum(r["passed"] for r in results)
    reason = f"result channel tampered with: {run.tampered}" if run.tampered else run.stopped
    all_passed = passed == total and run.done and reason is None
    return {"passed": passed, "total": total, "pass_rate": passed / total if total else 0.0,
            "all_passed": all_passed, "timed_out": run.timed_out,
            "loaded": bool(load and load.get("ok")), "load_error": load.get("error") if load else None,
            "results": results, "exit_code": run.exit_code, "stderr_tail": run.output[-STDERR_TAIL:],
            "reason": reason, "tampered": run.tampered is not None, "output_truncated": run.output_truncated,
            "sandbox": run.isolation}
