"""The unit-test verifier's sandbox, tried with hostile solutions in real processes (nothing mocked).

Each bad solution must be stopped quickly and scored as not passing with a reason, and a correct
solution must still pass right after it (the verifier keeps working).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.processors.test_verifiers import SOLUTION, UT, raw, rollout, score

REPO = Path(__file__).resolve().parents[2]
FAST_S = 8.0  # every bad run below ends well within this (the machine is shared and small)
GOOD_TASK = {"tests": ["assert add(1, 2) == 3", "assert add('a', 'b') == 'ab'"]}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox's isolation needs root")


def solution(code: str) -> str:
    return f"Here:\n```python\n{code.strip()}\n```\n"


def run_bad(code: str, tests: list[str], **options: Any) -> dict[str, Any]:
    started = time.perf_counter()
    out = raw(score(UT, rollout("bad", solution(code), {"tests": tests}), **options))
    assert time.perf_counter() - started < FAST_S
    return out


def assert_still_works() -> None:
    out = raw(score(UT, rollout("good", SOLUTION, GOOD_TASK)))
    assert out["all_passed"] and out["passed"] == 2, out


def sandbox_processes() -> list[int]:
    """Processes on this machine running as a sandbox uid (there must be none after a run)."""
    from processors.isolation import sandbox

    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            uid = int(status.split("Uid:")[1].split()[0])
            if sandbox.UID_BASE <= uid < sandbox.UID_BASE + sandbox.UID_SPAN:
                found.append(int(entry))
    return found


FORGER = r"""
import json, os
old = [{"kind": "load", "ok": True}, {"kind": "test", "name": "test_0", "ok": True}]
new = [{"kind": "ready", "seq": 0, "ok": True}, {"kind": "load", "seq": 1, "ok": True},
       {"kind": "test", "seq": 2, "name": "test_0", "ok": True}, {"kind": "done", "seq": 3},
       {"kind": "exit", "seq": -1, "code": 0}]
fake = "".join(json.dumps(m) + "\n" for m in old)
fake += "".join(json.dumps(m, separators=(",", ":"), sort_keys=True) + " " + "0" * 64 + "\n" for m in new)
try:  # the harness's own reporting function, if it can be found
    import __main__
    __main__.report(kind="load", ok=True)
    __main__.report(kind="test", name="test_0", ok=True)
except Exception:
    pass
print(fake, end="", flush=True)
for fd in range(1, 256):
    try:
        os.write(fd, fake.encode())
    except OSError:
        pass
os._exit(0)
"""


def test_forged_result_lines_are_not_a_pass() -> None:
    out = run_bad(FORGER, ["assert add(1, 2) == 3"])
    assert not out["all_passed"] and out["passed"] == 0
    assert out["tampered"] and "result channel" in out["reason"]
    assert out["results"] == [] and not out["loaded"]
    assert_still_works()


def test_exiting_early_with_code_zero_is_not_a_pass() -> None:
    out = run_bad("import os\nos._exit(0)", ["assert True"])
    assert not out["all_passed"] and out["passed"] == 0 and not out["tampered"]
    assert "exited (code 0) before the tests finished" in out["reason"]
    assert_still_works()


SNOOP = """
import glob, os

def leaks(secret):
    where = [k for k, v in os.environ.items() if secret in v]
    for path in glob.glob("/proc/*/environ") + glob.glob("/proc/*/cmdline"):
        try:
            if secret.encode() in open(path, "rb").read():
                where.append(path)
        except OSError:
            pass
    return where
"""

SNOOP_SCRIPT = """
import json, sys
from tests.processors.test_verifiers import UT, rollout, score
s = score(UT, rollout("snoop", sys.argv[1], json.loads(sys.argv[2])))
print(json.dumps(s))
"""


def test_solution_sees_no_secret_and_no_file_of_the_parent() -> None:
    secret = "hunter2-" + secrets.token_hex(8)
    allowed = {"PATH", "HOME", "LANG", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE"}
    tests = [f"assert leaks({secret!r}) == []",
             "assert not [k for k in __import__('os').environ if 'TOKENTRAIL' in k]",
             f"assert set(__import__('os').environ) <= set({sorted(allowed)!r})",
             "open('/etc/shadow').read()"]
    env = {**os.environ, "TOKENTRAIL_KAFKA__SASL_PASSWORD": secret, "TOKENTRAIL_CLICKHOUSE__PASSWORD": secret}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", SNOOP_SCRIPT, solution(SNOOP), json.dumps({"tests": tests})],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True)
    assert time.perf_counter() - started < 30
    out = raw(json.loads(done.stdout))
    assert [r["passed"] for r in out["results"]] == [True, True, True, False], out["results"]
    assert out["results"][3]["error"].startswith("PermissionError")  # runs as an unprivileged uid
    assert secret not in json.dumps(out)
    assert_still_works()


REACH = """
import socket

def reach(port):
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    return True

def serve_myself():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        return reach(s.getsockname()[1])
"""


def test_no_network_outside_the_sandbox() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        out = run_bad(REACH, [f"assert reach({port})", "assert serve_myself()"])
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected
    assert [r["passed"] for r in out["results"]] == [False, True]  # its own loopback works
    assert "Connection refused" in out["results"][0]["error"] or "unreachable" in out["results"][0]["error"]
    assert not out["all_passed"]
    assert_still_works()


def test_two_gigabytes_of_memory_are_refused() -> None:
    out = run_bad("def hog():\n    return bytearray(2 * 1024 ** 3)", ["hog()"])
    assert not out["all_passed"] and out["results"][0]["error"].startswith("MemoryError")
    assert_still_works()


FORKER = """
import os, time

def spawn(n):
    for made in range(n):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
    return n
"""


def test_forking_many_processes_is_stopped_and_nothing_is_left_behind() -> None:
    out = run_bad(FORKER, ["assert spawn(200) == 200"])
    assert not out["all_passed"], out
    assert out["results"][0]["error"].startswith("BlockingIOError")  # the process limit
    assert sandbox_processes() == []  # the sleeping children died with the sandbox
    assert_still_works()


DAEMON = """
import os, time

def daemon(marker):
    if os.fork() == 0:
        os.setsid()  # leaves the process group the verifier kills
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", marker])
        os._exit(0)
    time.sleep(0.5)
    return True
"""


def _running(argv: list[str]) -> list[int]:
    needle = "\0".join(argv).encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/cmdline").read_bytes().rstrip(b"\0") == needle:
                    found.append(int(entry))
            except OSError:
                pass
    return found


def test_a_daemon_the_solution_starts_does_not_outlive_the_run() -> None:
    marker = f"37.{secrets.randbelow(10**6):06d}"
    try:
        out = run_bad(DAEMON, [f"assert daemon({marker!r})"])
        assert out["all_passed"]
        assert _running(["sleep", marker]) == []
    finally:
        for pid in _running(["sleep", marker]):
            os.kill(pid, signal.SIGKILL)
    assert_still_works()


WRITER = """
def write(name, mb):
    with open(name, "wb") as f:
        for _ in range(mb):
            f.write(b"x" * (1 << 20))
    return True
"""


def test_a_huge_file_and_a_full_scratch_disk_are_stopped() -> None:
    out = run_bad(WRITER, ["assert write('big', 64)", "assert all(write(f'f{i}', 12) for i in range(8))"])
    assert not out["all_passed"] and out["passed"] == 0
    assert "File too large" in out["results"][0]["error"]  # max_file_mb
    assert "No space left on device" in out["results"][1]["error"]  # scratch_mb
    assert_still_works()


LOUD = """
import sys

def shout():
    for _ in range(100):
        sys.stdout.write("x" * (1 << 20))
    sys.stdout.flush()
    return True
"""


def test_a_hundred_megabytes_of_output_are_cut_off() -> None:
    out = run_bad(LOUD, ["assert shout()"])
    assert not out["all_passed"] and out["output_truncated"]
    assert out["reason"].startswith("output limit") and len(out["stderr_tail"]) <= 2000
    assert_still_works()


FAIL_CLOSED_SCRIPT = """
import json, sys
from tests.processors.test_verifiers import SOLUTION, UT, rollout, score
task = {"tests": ["import os; assert os.getuid() != 0", "assert add(1, 2) == 3"]}
print(json.dumps([score(UT, rollout("r", SOLUTION, task), **json.loads(arg)) for arg in sys.argv[1:]]))
"""


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux setpriv")
def test_without_namespaces_the_verifier_fails_closed_unless_allowed() -> None:
    """The processors without CAP_SYS_ADMIN (a default container): no namespaces can be made."""
    options = [{}, {"require_namespaces": False}, {"require_namespaces": False, "python": "/usr/bin/python3"}]
    done = subprocess.run(["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", "--", sys.executable,
                           "-c", FAIL_CLOSED_SCRIPT, *map(json.dumps, options)],
                          cwd=REPO, env={**os.environ}, capture_output=True, text=True, timeout=60, check=True)
    closed, unreadable, allowed = json.loads(done.stdout)
    assert closed["status"] == "ERROR" and "sandbox unavailable: cannot create namespaces" in closed["error"]
    assert unreadable["status"] == "ERROR" and "not readable by an unprivileged user" in unreadable["error"]
    if Path("/usr/bin/python3").exists():
        out = raw(allowed)
        assert out["all_passed"] and out["sandbox"] == "limits-only"
    assert_still_works()


def test_an_interpreter_under_tmp_is_put_back_into_the_sandbox(tmp_path: Path) -> None:
    """The sandbox replaces /tmp with its own tmpfs; an interpreter (a checkout's venv) living under /tmp must
    still be there inside it. CI's clone under /tmp found this: every sandboxed run was an ERROR."""
    venv = tmp_path / "venv"  # pytest's tmp_path is under /tmp
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    out = raw(score(UT, rollout("good", SOLUTION, GOOD_TASK), python=str(venv / "bin" / "python")))
    assert out["all_passed"] and out["passed"] == 2 and out["sandbox"] != "limits-only", out
    assert_still_works()
