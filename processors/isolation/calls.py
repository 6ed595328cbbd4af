"""How a verifier is called: in a thread with a time limit, or in a fresh process killed on time-out.

Isolation per verifier:
  * ``thread`` (default): the call runs in a daemon thread; on time-out the score is TIMEOUT and the
    thread is abandoned (Python cannot kill it), so use it for verifiers that cannot hang for good.
  * ``process``: the call runs in a fresh process (forkserver), killed on time-out; for untrusted
    or crash-prone code. The verifier is re-loaded in the child from its import path and options.
An exception (or a child that dies) gives an ERROR outcome with the exception text; nothing escapes.
The pure ``processors.verifiers.runner.VerifierRunner`` turns outcomes into Score records; this module
is the process and thread handling it is given (``verifier_runner()``).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from processors.verifiers.base import Verifier, load_verifier
from processors.verifiers.runner import VerifierRunner

MAX_ERROR_CHARS = 4000


def _describe(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-MAX_ERROR_CHARS:]


def _in_thread(fn: Callable[[], Any], timeout_s: float) -> tuple[str, Any, str | None]:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # a verifier crash must not escape, whatever it raises
            box["error"] = _describe(exc)

    thread = threading.Thread(target=target, name="verifier", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return "TIMEOUT", None, f"verifier did not return within {timeout_s:g}s (thread abandoned)"
    if "error" in box:
        return "ERROR", None, box["error"]
    return "OK", box.get("value"), None


def _child(ref: str, options: dict[str, Any], method: str, args: tuple[Any, ...], conn: Any) -> None:
    try:
        verifier = load_verifier(ref, **options)
        conn.send(("OK", getattr(verifier, method)(*args), None))
    except BaseException as exc:
        conn.send(("ERROR", None, _describe(exc)))
    finally:
        conn.close()


def _in_process(verifier: Verifier, method: str, args: tuple[Any, ...],
                timeout_s: float) -> tuple[str, Any, str | None]:
    ctx = multiprocessing.get_context("forkserver")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(verifier.ref, verifier.raw_options, method, args, child),
                       daemon=True)
    proc.start()
    child.close()
    try:
        if parent.poll(timeout_s):
            try:
                return parent.recv()
            except EOFError:
                pass
            proc.join(1.0)
            return "ERROR", None, f"verifier process died (exit code {proc.exitcode})"
        return "TIMEOUT", None, f"verifier process did not return within {timeout_s:g}s (killed)"
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5.0)
        parent.close()


def isolated_call(verifier: Verifier, method: str, args: tuple[Any, ...]) -> tuple[str, Any, str | None]:
    """(status, value, error) of ``verifier.<method>(*args)`` under the verifier's isolation and time limit."""
    if verifier.isolation == "process":
        return _in_process(verifier, method, args, verifier.timeout_s)
    return _in_thread(lambda: getattr(verifier, method)(*args), verifier.timeout_s)


def verifier_runner(timer: Callable[[], float] = time.perf_counter) -> VerifierRunner:
    """The runner every process uses; ``timer`` measures duration_ms (a constant one makes records
    reproducible)."""
    return VerifierRunner(isolated_call, timer)
