"""The unit-test sandbox's program: everything that runs inside the sandbox (``sandbox.py`` has the design).

The parent (``processors/isolation/sandbox.py``) runs this file's source with ``python -c``, so it imports only
the standard library and needs no readable copy of this repository inside the sandbox. It runs as the
supervisor (reads the configuration from stdin, builds the namespaces' mounts, forks the worker, reports how the
worker ended) and as the worker (limits, identity, then setup, solution and tests), each line of results signed.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import hmac
import json
import os
import signal
import sys
from typing import Any

SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
HIDDEN_DIRS = ("/run",)
READY, EXIT = 0, -1  # sequence numbers of the supervisor's lines; the worker's count from 1
PR_SET_NO_NEW_PRIVS = 38
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_MOVE, MS_REC = 2, 4, 8, 4096, 8192, 16384


def _child_main() -> None:
    if sys.path and sys.path[0] in ("", "."):
        del sys.path[0]  # never import from the working directory
    os.umask(0o022)
    res_fd = int(sys.argv[1])
    if res_fd != 3:
        os.dup2(res_fd, 3)
        os.close(res_fd)
    chunks = []
    while chunk := os.read(0, 1 << 20):
        chunks.append(chunk)
    cfg = json.loads(b"".join(chunks))
    del chunks
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    send = _sender(3, hmac.new(bytes.fromhex(cfg.pop("key")), digestmod=hashlib.sha256))
    try:
        _prepare(cfg)
    except Exception as exc:  # the sandbox cannot be built: say so, run nothing
        send({"kind": "ready", "seq": READY, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
        os._exit(0)
    send({"kind": "ready", "seq": READY, "ok": True})
    pid = os.fork()
    if pid == 0:
        try:
            _worker(cfg, send)
        finally:
            os._exit(70)
    status = _wait_for(pid)
    if cfg["reap"]:
        _reap(cfg["uid"], cfg["gid"])
    send({"kind": "exit", "seq": EXIT, **_status(status)})
    os._exit(0)


def _sender(fd: int, signer: Any) -> Any:
    def send(fields: dict[str, Any]) -> None:
        payload = json.dumps(fields, separators=(",", ":"), sort_keys=True).encode()
        tag = signer.copy()
        tag.update(payload)
        data = payload + b" " + tag.hexdigest().encode() + b"\n"
        while data:
            data = data[os.write(fd, data):]
    return send


def _status(status: int | None) -> dict[str, Any]:
    if status is None:
        return {"code": None}
    if os.WIFSIGNALED(status):
        num = os.WTERMSIG(status)
        try:
            name = signal.Signals(num).name
        except ValueError:
            name = f"signal {num}"
        return {"signal": name, "signum": num}
    return {"code": os.WEXITSTATUS(status)}


def _wait_for(pid: int) -> int | None:
    while True:  # as PID 1, this also reaps the orphans the solution leaves
        try:
            got, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return None
        if got == pid:
            return status


def _reap(uid: int, gid: int) -> None:
    """Without a PID namespace: kill every process of this run's own uid (one kill(-1) as that uid)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _prepare(cfg: dict[str, Any]) -> None:
    libc = _libc()
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    uid, gid = cfg["uid"], cfg["gid"]
    if cfg["namespaces"]:
        _mounts(libc, cfg)
        _loopback_up()
        os.mkdir(cfg["workdir"], 0o700)
    elif uid is not None:
        blocked = [p for p in _interpreter_dirs() if _blocked_ancestor(p)]
        if blocked:
            raise RuntimeError(f"the interpreter's files ({blocked[0]}) are not readable by an unprivileged "
                               "user; without namespaces, set the verifier's python to one every user can read")
    if uid is not None:
        os.chown(cfg["workdir"], uid, gid)
        os.chmod(cfg["workdir"], 0o700)


def _errno() -> int:
    import ctypes

    return ctypes.get_errno()


def _mount(libc: Any, source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    import ctypes

    if libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, ctypes.c_ulong(flags),
                  data.encode() if data else None) != 0:
        err = _errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _interpreter_dirs() -> list[str]:
    cands = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable),
             os.path.dirname(os.path.realpath(sys.executable)), *sys.path]
    real = sorted({os.path.realpath(p) for p in cands if p and os.path.isdir(p)})
    out: list[str] = []
    for p in real:
        if not any(_under(p, q) for q in out):
            out.append(p)
    return out


def _blocked_ancestor(path: str) -> str | None:
    """The first directory above ``path`` that users other than its owner cannot enter."""
    cur = ""
    for part in path.strip("/").split("/")[:-1]:
        cur += "/" + part
        if not os.stat(cur).st_mode & 0o001:
            return cur
    return None


def _mounts(libc: Any, cfg: dict[str, Any]) -> None:
    stage = cfg["stage"]
    size = cfg["limits"]["scratch_bytes"]
    flags = MS_NOSUID | MS_NODEV
    _mount(libc, "tmpfs", stage, "tmpfs", flags, f"size={size},mode=1777")
    covers: dict[str, list[str]] = {}
    in_scratch: list[tuple[str, str]] = []  # (aside, path): interpreter dirs under /tmp & co, put back below
    for path in _interpreter_dirs():
        if any(_under(path, d) for d in HIDDEN_DIRS):
            raise RuntimeError(f"the interpreter lives under {path}, which the sandbox replaces")
        if any(_under(path, d) for d in SCRATCH_DIRS):  # e.g. a checkout (and its venv) under /tmp
            aside = os.path.join(stage, f".interpreter{len(in_scratch)}")
            os.mkdir(aside, 0o755)
            _mount(libc, path, aside, None, MS_BIND | MS_REC, None)
            in_scratch.append((os.path.basename(aside), path))
            continue
        blocked = _blocked_ancestor(path)
        if blocked:
            if blocked == "/" or _under(stage, blocked):
                raise RuntimeError(f"cannot expose the interpreter under {blocked}")
            covers.setdefault(blocked, []).append(path)
    staged = []
    for top, paths in covers.items():  # mount the interpreter's directories aside, cover, mount them back
        for path in paths:
            spot = os.path.join(stage, f".expose{len(staged)}")
            os.mkdir(spot, 0o700)
            _mount(libc, path, spot, None, MS_BIND | MS_REC, None)
            staged.append((spot, path))
        _mount(libc, "tmpfs", top, "tmpfs", flags, "size=1m,mode=0755")
    for spot, path in staged:
        os.makedirs(path, 0o755, exist_ok=True)
        _mount(libc, spot, path, None, MS_MOVE, None)
        os.rmdir(spot)
    first = True
    for d in SCRATCH_DIRS:
        if os.path.isdir(d) and not os.path.islink(d):
            # Recursive for the stage: interpreter dirs set aside in it come along, to be moved into place.
            _mount(libc, stage if first else SCRATCH_DIRS[0], d, None, MS_BIND | (MS_REC if first else 0), None)
            first = False
    for name, path in in_scratch:  # the stage is /tmp now: move each interpreter dir to its own path in it
        os.makedirs(path, 0o755, exist_ok=True)
        _mount(libc, os.path.join(SCRATCH_DIRS[0], name), path, None, MS_MOVE, None)
        with contextlib.suppress(OSError):  # the stage's own copy may stay busy: an empty dir, harmless
            os.rmdir(os.path.join(SCRATCH_DIRS[0], name))
    for d in HIDDEN_DIRS:
        if os.path.isdir(d) and not os.path.islink(d):
            _mount(libc, "tmpfs", d, "tmpfs", flags | MS_NOEXEC, "size=1m,mode=0755")


def _loopback_up() -> None:
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = fcntl.ioctl(s, 0x8913, struct.pack("16sH22x", b"lo", 0))  # SIOCGIFFLAGS
        flags = struct.unpack("16sH22x", ifr)[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", flags | 1))  # SIOCSIFFLAGS, IFF_UP


def _worker(cfg: dict[str, Any], send: Any) -> None:
    import resource

    lim = cfg["limits"]
    for which, value in ((resource.RLIMIT_AS, lim["memory_bytes"]), (resource.RLIMIT_NPROC, lim["processes"]),
                         (resource.RLIMIT_FSIZE, lim["file_bytes"]), (resource.RLIMIT_NOFILE, lim["open_files"]),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(which, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu_s"], lim["cpu_s"] + 1))
    uid, gid = cfg["uid"], cfg["gid"]
    if uid is not None:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        if os.getuid() != uid or os.geteuid() != uid:
            raise SystemExit(71)
    os.chdir(cfg["workdir"])
    me = os.getpid()
    seq = [0]

    def report(**fields: Any) -> None:
        if os.getpid() != me:
            os._exit(0)  # a fork the solution made never reports
        seq[0] += 1
        send({**fields, "seq": seq[0]})

    _run_tests(cfg.pop("code"), cfg.pop("spec"), report)
    report(kind="done")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(0)


def _describe(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except BaseException:
        text = type(exc).__name__
    return text[:500]


def _run_tests(code: str, spec: dict[str, Any], report: Any) -> None:
    ns: dict[str, Any] = {"__name__": "solution", "__builtins__": builtins}
    try:
        if spec["setup"]:
            exec(compile(spec["setup"], "setup.py", "exec"), ns)
        exec(compile(code, "solution.py", "exec"), ns)
    except BaseException as exc:
        report(kind="load", ok=False, error=_describe(exc))
        return
    report(kind="load", ok=True)
    if spec["mode"] == "list":
        for i, test in enumerate(spec["items"]):
            try:
                exec(compile(test, f"test_{i}.py", "exec"), dict(ns))
                report(kind="test", name=f"test_{i}", ok=True)
            except BaseException as exc:
                report(kind="test", name=f"test_{i}", ok=False, error=_describe(exc))
        return
    module = dict(ns)
    try:
        exec(compile(spec["items"][0], "tests.py", "exec"), module)
    except BaseException as exc:
        report(kind="test", name="tests", ok=False, error=_describe(exc))
        return
    names = sorted(k for k, v in module.items() if k.startswith("test") and callable(v) and k not in ns)
    if not names:
        report(kind="test", name="tests", ok=True)
    for name in names:
        try:
            module[name]()
            report(kind="test", name=name, ok=True)
        except BaseException as exc:
            report(kind="test", name=name, ok=False, error=_describe(exc))


if __name__ == "__main__":
    _child_main()
