"""The unit-test sandbox: run a model's Python solution against tests in a separate, walled-off process.

Threat model: the solution is hostile. It may try to make the verifier report a pass it did not earn,
read the processors' secrets, reach the network, or exhaust the machine. What it can do is bounded as
follows (each wall is set up by trusted code before any solution code runs):

* **Result channel.** Results travel on their own pipe (not stdout/stderr), and every line carries an
  HMAC-SHA256 tag under a random per-run key. The key reaches the sandbox on stdin, which the
  sandbox reads to the end and replaces with /dev/null before the solution is loaded; it is never in
  the environment, argv or a file. The parent accepts only lines whose tag verifies, in order (a
  ``ready`` line from the supervisor, numbered ``load``/``test``/``done`` lines from the worker, an
  ``exit`` line from the supervisor last); any other byte on the channel voids the run (``tampered``:
  nothing passes). Why not the alternatives: a separate descriptor alone is writable by any code in
  the process (``os.write`` on a number found in /proc/self/fd), and a file in a directory the
  solution cannot write must still be written by the harness, i.e. by the same process and uid as
  the solution. Authentication is the only design under which writing the channel is not enough:
  printing, or writing fake lines to every descriptor, gets the run rejected. Limit, stated honestly:
  the tests call the solution in the same interpreter, so deliberately targeted introspection of that
  interpreter (``gc``, frames, ``ctypes``) can reach the signing object, as it can reach the tests
  themselves (an object whose ``__eq__`` is always true); no in-process harness can stop that, and
  the walls below bound what it gains to the reward of that one rollout.
* **Two processes inside.** A supervisor (no solution code, ever) reads the configuration, builds the
  sandbox and forks the worker; the worker sets the resource limits, drops to an unprivileged uid and
  runs setup, solution and tests. The supervisor reports how the worker ended (exit code or signal,
  e.g. SIGXCPU) and, as PID 1 of the sandbox's PID namespace, takes every process left behind with
  it when it exits.
* **Namespaces** (``unshare`` from util-linux; needs root): a new network namespace (only its own
  loopback, brought up so a solution may serve itself; nothing outside is reachable), PID namespace
  with its own /proc (the host's processes and their environments are invisible), mount, IPC and UTS
  namespaces. In the mount namespace /tmp, /var/tmp and /dev/shm are one size-limited tmpfs (the
  working directory and HOME live there, and it vanishes with the sandbox), /run is an empty tmpfs
  (no host sockets), and a directory that other users cannot enter on the way to the interpreter
  (e.g. /root for a pyenv Python) is covered by an empty tmpfs with only the interpreter's
  directories mounted back, so the solution sees the interpreter and nothing else of it.
  Fail closed: if the namespaces cannot be made (not root, or a container without CAP_SYS_ADMIN) the
  run raises ``SandboxUnavailable`` (an ERROR score) unless ``require_namespaces`` is false, which
  runs with everything below but shares the host's network, /tmp and process table.
* **Identity.** When the processors run as root the worker runs as a fresh random uid/gid
  (``user="auto"``, no supplementary groups) or a named user, with ``no_new_privs`` set, so it cannot
  read the parent's files or use setuid programs, and per-uid process limits count only this run.
* **Limits** (``setrlimit`` in the worker): CPU seconds, address space, processes, file size, open
  files, no core files; a wall-clock limit after which the whole process group is killed; at most
  ``output_bytes`` of stdout+stderr are read (then the sandbox is stopped and the run says so) and at
  most ``RESULT_BYTES`` of results.
* **Environment.** Only PATH, HOME, LANG, PYTHONHASHSEED and PYTHONDONTWRITEBYTECODE (plus TMPDIR
  without namespaces); nothing of the parent's (no TOKENTRAIL_*, no credentials).

The sandbox's program is ``sandbox_child.py`` beside this file: the parent runs its source with ``python -c``
(so it imports only the standard library and needs no readable copy of this repository inside the sandbox).
This file is the parent's side: it builds the configuration, starts the sandbox and reads its channel.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import pwd
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from processors.isolation import sandbox_child
from processors.isolation.sandbox_child import EXIT, READY

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
NS_FLAGS = ("--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--uts")
NS_WORKDIR = "/tmp/work"
UID_BASE = 1_500_000_000  # user="auto": a fresh uid in [UID_BASE, UID_BASE + UID_SPAN) per run
UID_SPAN = 100_000_000
RESULT_BYTES = 4 << 20
TAIL_BYTES = 8192
STARTUP_S = 15.0  # the supervisor must say ``ready`` within this; the time limit starts after it


class SandboxUnavailable(RuntimeError):
    """The sandbox could not be built; nothing of the solution ran. The verifier's score is ERROR."""


@dataclass(frozen=True)
class Limits:
    time_s: float = 10.0  # wall clock, from the sandbox being ready
    cpu_s: int = 11
    memory_bytes: int = 1 << 30  # address space
    processes: int = 32  # per uid; threads count
    file_bytes: int = 16 << 20  # largest file
    open_files: int = 64
    scratch_bytes: int = 64 << 20  # the tmpfs holding /tmp, /var/tmp, /dev/shm and the work dir
    output_bytes: int = 1 << 20  # stdout + stderr read before the sandbox is stopped


@dataclass
class SandboxRun:
    events: list[dict[str, Any]] = field(default_factory=list)  # the worker's authenticated lines
    done: bool = False  # the worker reported the end of the tests
    tampered: str | None = None  # why the result channel was rejected
    stopped: str | None = None  # why the run ended early (limit, signal, early exit)
    timed_out: bool = False
    output_truncated: bool = False
    output: str = ""  # the last TAIL_BYTES of stdout + stderr, the work dir shown as <sandbox>
    exit_code: int | None = None  # the worker's exit code, or -signal; None when killed from outside
    isolation: str = "namespaces"  # or "limits-only"


# ----------------------------------------------------------------------------------- parent side

_probe_lock = threading.Lock()
_probe_ok: list[bool] = []


def namespace_problem() -> str | None:
    """None when this process can build the namespaces; else why not (a success is remembered, a
    failure is checked again on the next run)."""
    with _probe_lock:
        if _probe_ok:
            return None
        problem = _probe_namespaces()
        if problem is None:
            _probe_ok.append(True)
        return problem


def _probe_namespaces() -> str | None:
    if os.geteuid() != 0:
        return "the processors do not run as root"
    unshare = shutil.which("unshare") or shutil.which("unshare", path=SAFE_PATH)
    true = shutil.which("true", path=SAFE_PATH)
    if not unshare or not true:
        return "util-linux unshare not found"
    try:
        done = subprocess.run([unshare, *NS_FLAGS, "--", true], capture_output=True, timeout=10,
                              env={"PATH": SAFE_PATH}, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    if done.returncode != 0:
        return f"unshare failed: {done.stderr.decode(errors='replace').strip()[:300]}"
    return None


def _identity(user: str) -> tuple[int | None, int | None, bool]:
    """(uid, gid, reap_by_uid) for the worker; (None, None, False) when the processors are not root."""
    if os.geteuid() != 0:
        return None, None, False
    if user == "auto":
        uid = UID_BASE + secrets.randbelow(UID_SPAN)
        return uid, uid, True
    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
        uid, gid = entry.pw_uid, entry.pw_gid
    except (KeyError, ValueError):
        if not user.isdigit():
            raise SandboxUnavailable(f"sandbox unavailable: no user {user!r}") from None
        uid = gid = int(user)
    if uid == 0:
        raise SandboxUnavailable("sandbox unavailable: refusing to run solutions as root")
    return uid, gid, False


def _child_source() -> str:
    with open(sandbox_child.__file__, encoding="utf-8") as f:
        return f.read()


def run(code: str, spec: dict[str, Any], limits: Limits, *, python: str = "", user: str = "auto",
        require_namespaces: bool = True) -> SandboxRun:
    """Run ``code`` against the tests in ``spec`` (``mode``, ``items``, ``setup``) in the sandbox.

    Raises SandboxUnavailable when the sandbox cannot be built; everything the solution does is in
    the returned SandboxRun."""
    problem = namespace_problem()
    if problem is not None and require_namespaces:
        raise SandboxUnavailable(f"sandbox unavailable: cannot create namespaces ({problem}); "
                                 "the verifier fails closed (require_namespaces: false runs with limits only)")
    use_ns = problem is None
    uid, gid, reap = _identity(user)
    key = secrets.token_bytes(32)
    stage = tempfile.mkdtemp(prefix="tokentrail-sandbox-")
    workdir = NS_WORKDIR if use_ns else stage
    env = {"PATH": SAFE_PATH, "HOME": workdir, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
           "PYTHONDONTWRITEBYTECODE": "1"}
    if not use_ns:
        env["TMPDIR"] = workdir
    config = {"key": key.hex(), "code": code, "spec": spec, "limits": limits.__dict__, "uid": uid, "gid": gid,
              "reap": reap and not use_ns, "namespaces": use_ns, "stage": stage, "workdir": workdir}
    try:
        result = _launch(python or sys.executable, config, env, key, limits, use_ns)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    result.isolation = "namespaces" if use_ns else "limits-only"
    result.output = result.output.replace(workdir, "<sandbox>")
    return result


def _launch(python: str, config: dict[str, Any], env: dict[str, str], key: bytes, limits: Limits,
            use_ns: bool) -> SandboxRun:
    res_r, res_w = os.pipe()
    prefix = [shutil.which("unshare") or shutil.which("unshare", path=SAFE_PATH) or "unshare", *NS_FLAGS,
              "--"] if use_ns else []
    cmd = [*prefix, python, "-s", "-B", "-c", _child_source(), str(res_w)]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                pass_fds=(res_w,), env=env, cwd="/", start_new_session=True)
    except OSError as exc:
        os.close(res_r)
        raise SandboxUnavailable(f"sandbox unavailable: cannot start {cmd[0]}: {exc}") from exc
    finally:
        os.close(res_w)
    try:
        return _supervise(proc, json.dumps(config).encode(), res_r, key, limits)
    finally:
        _kill(proc)
        proc.wait()
        for f in (proc.stdin, proc.stdout):
            if f is not None and not f.closed:
                f.close()
        os.close(res_r)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _Channel:
    """Reads the result pipe: accepts only authenticated lines in the agreed order."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.buf = bytearray()
        self.size = 0
        self.ready: dict[str, Any] | None = None
        self.exit: dict[str, Any] | None = None
        self.events: list[dict[str, Any]] = []
        self.problem: str | None = None

    def feed(self, data: bytes) -> None:
        self.size += len(data)
        self.buf += data
        while (end := self.buf.find(b"\n")) >= 0:
            line = bytes(self.buf[:end])
            del self.buf[:end + 1]
            if self.problem is None:
                self._take(line)

    def _take(self, line: bytes) -> None:
        payload, _, tag = line.rpartition(b" ")
        good = hmac.new(self.key, payload, hashlib.sha256).hexdigest().encode()
        if not payload or not hmac.compare_digest(tag, good):
            self.problem = f"an unauthenticated line on the result channel: {line[:80]!r}"
            return
        try:
            msg = json.loads(payload)
            kind, seq = msg.get("kind"), msg.get("seq")
        except (ValueError, AttributeError):
            self.problem = f"a malformed result line: {payload[:80]!r}"
            return
        if self.exit is not None:
            self.problem = "a line after the sandbox's exit report"
        elif kind == "ready" and seq == READY and self.ready is None:
            self.ready = msg
        elif kind == "exit" and seq == EXIT and self.ready is not None:
            self.exit = msg
        elif (self.ready is not None and seq == len(self.events) + 1 and kind in ("load", "test", "done")
              and not (self.events and self.events[-1]["kind"] == "done")):
            self.events.append(msg)
        else:
            self.problem = f"a result line out of order: {payload[:80]!r}"


def _supervise(proc: subprocess.Popen[bytes], config: bytes, res_fd: int, key: bytes,
               limits: Limits) -> SandboxRun:
    assert proc.stdin is not None and proc.stdout is not None
    result = SandboxRun()
    channel = _Channel(key)
    sel = selectors.DefaultSelector()
    in_fd, out_fd = proc.stdin.fileno(), proc.stdout.fileno()
    os.set_blocking(in_fd, False)
    sel.register(in_fd, selectors.EVENT_WRITE)
    sel.register(out_fd, selectors.EVENT_READ)
    sel.register(res_fd, selectors.EVENT_READ)
    pending = memoryview(config)
    tail = bytearray()
    out_total = 0
    started = time.monotonic()
    ready_at: float | None = None
    killed: str | None = None
    while sel.get_map():
        now = time.monotonic()
        if ready_at is None and channel.ready is not None:
            ready_at = now
        deadline = ready_at + limits.time_s if ready_at is not None else started + STARTUP_S
        if now >= deadline:
            killed = "time" if ready_at is not None else "startup"
            break
        # After the exit report and the sandbox's end, read only what is already there: anything
        # still holding a pipe open is a leftover (without a PID namespace).
        finishing = channel.exit is not None and proc.poll() is not None
        wait = 0.0 if finishing else deadline - now if channel.exit is None else min(deadline - now, 0.1)
        ready_events = sel.select(wait)
        if finishing and not ready_events:
            break
        for sk, _ in ready_events:
            if sk.fd == in_fd:
                try:
                    sent = os.write(in_fd, pending[:1 << 16])
                    pending = pending[sent:]
                except BlockingIOError:
                    continue
                except BrokenPipeError:
                    pending = pending[:0]
                if not pending:
                    sel.unregister(in_fd)
                    proc.stdin.close()
                continue
            data = os.read(sk.fd, 1 << 16)
            if not data:
                sel.unregister(sk.fd)
            elif sk.fd == out_fd:
                out_total += len(data)
                tail += data
                del tail[:-TAIL_BYTES]
                if out_total > limits.output_bytes:
                    killed = "output"
            else:
                channel.feed(data)
                if channel.size > RESULT_BYTES:
                    killed = "results"
                elif channel.problem and channel.ready is not None:
                    killed = "tampered"  # the run is void already; stop it
        if killed:
            break
    sel.close()
    if killed:
        _kill(proc)
    result.output = tail.decode(errors="replace")
    if channel.ready is None or not channel.ready.get("ok"):
        if channel.ready is not None:
            raise SandboxUnavailable(f"sandbox unavailable: {channel.ready.get('error')}")
        if killed == "startup":
            raise SandboxUnavailable(f"sandbox unavailable: not ready within {STARTUP_S:g}s")
        proc.wait()
        raise SandboxUnavailable(f"sandbox unavailable: it did not start (exit {proc.returncode}): "
                                 f"{result.output[-1000:]}")
    result.events = channel.events
    result.done = bool(channel.events) and channel.events[-1]["kind"] == "done"
    result.tampered = channel.problem
    if channel.buf and killed is None and channel.exit is not None and result.tampered is None:
        result.tampered = f"an unterminated line on the result channel: {bytes(channel.buf[:80])!r}"
    result.timed_out = killed == "time"
    result.output_truncated = killed == "output"
    if channel.exit is not None:
        result.exit_code = channel.exit.get("code", -int(channel.exit.get("signum", 0)))
    result.stopped = _stopped(killed, channel.exit, result.done, limits)
    return result


def _stopped(killed: str | None, exit: dict[str, Any] | None, done: bool, limits: Limits) -> str | None:
    if killed == "time":
        return f"time limit: the tests did not finish within {limits.time_s:g}s; the sandbox was killed"
    if killed == "output":
        return (f"output limit: more than {limits.output_bytes} bytes of stdout/stderr; the rest was "
                "discarded and the sandbox was stopped")
    if killed == "tampered":
        return "the result channel was tampered with; the sandbox was stopped"
    if killed == "results":
        return f"result channel limit: more than {RESULT_BYTES} bytes of results; the sandbox was stopped"
    if exit is None:
        return "the sandbox ended without reporting how the tests ended"
    name = exit.get("signal")
    if name == "SIGXCPU":
        return f"CPU time limit: more than {limits.cpu_s}s of CPU time (SIGXCPU)"
    if name == "SIGXFSZ":
        return f"file size limit: a file larger than {limits.file_bytes} bytes (SIGXFSZ)"
    if name == "SIGKILL":
        return "killed by SIGKILL: the CPU time hard limit, or out of memory"
    if name:
        return f"the test process was killed by {name}"
    if not done:
        return f"the test process exited (code {exit.get('code')}) before the tests finished"
    return None
