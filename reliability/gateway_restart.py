"""Fault (d) of issue 17 (``i`` in the table): a gateway process restarted mid-session under a live client;
the session goes on.

A gateway process serves private topics of the shared broker. A client session (the real openai SDK with
the attempt's minted key and the plain base URL, as a harness is configured) calls continuously. The
gateway is restarted twice under it: SIGTERM (a rolling deploy: calls in flight finish first) and kill -9
with a call in flight (a crash). The client, like a harness, retries what failed to connect. The new
process rebuilds the attempt from Kafka (producers/gateway/recovery.py) and the session continues with the
same key and index sequence. Reported: acknowledged calls not on Kafka (lost), copies of one event id
(duplicated), calls recorded but never answered (a crash mid-call), and whether the attempt assembles into
a COMPLETE rollout with the finish's counts (the processors' pure core).

    python -m reliability.gateway_restart zygote --calls-topic T --env-topic E --run-dir D

warms up once (imports, the model's text side) and forks the chain of gateway processes (settings from
the TOKENTRAIL_* environment); each builds its app, then waits for the one before it to exit, takes over
the address, rebuilds the attempts from Kafka and serves. Forking from one warm process keeps the fault
fast; each gateway is still a process of its own, stopped by SIGTERM or killed with -9 by its pid.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from processors.assembler import RolloutAssembly
from reliability.faults import Progress, Sizes, free_port
from reliability.results import FaultResult
from schemas.codec import DecodeError, get_codec
from testkit.kafka_read import create_topics, delete_topics, lost_and_duplicated, read_records
from tokentrail.runtime.process import settings_env
from tokentrail.settings import REPO_ROOT, Settings

# Issue 17's fault (d); "i" in the table, after the letters the other faults already use.
NAME = "i. gateway restarted mid-session (SIGTERM, kill -9)"
# How long a client keeps retrying a call that cannot connect (a gateway starting up takes seconds).
RETRY_WINDOW_S = 180.0
THINK_S = 0.05  # the harness's own work between calls (tools, parsing)


class ForkedGateway:
    """One gateway process of the chain, forked by the zygote (``zygote`` below) and known by its pid."""

    def __init__(self, url: str, run_dir: Path, n: int, zygote: subprocess.Popen) -> None:
        self.url, self.run_dir, self.n, self.zygote = url, run_dir, n, zygote
        self.log_path = run_dir / f"gateway-{n}.log"

    @property
    def pid(self) -> int:
        self._wait(lambda: (self.run_dir / f"gateway-{self.n}.pid").exists(), 60, "be forked")
        return int((self.run_dir / f"gateway-{self.n}.pid").read_text())

    def wait_warm(self, timeout_s: float = 300.0) -> None:
        self._wait(lambda: (self.run_dir / f"gateway-{self.n}.warm").exists(), timeout_s, "warm up")

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        def answers() -> bool:
            try:
                return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        self._wait(answers, timeout_s, "answer")

    def _wait(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if done():
                return
            if self.zygote.poll() is not None:
                raise RuntimeError(f"the gateway processes are gone (zygote exit {self.zygote.returncode}); "
                                   f"see {self.log_path}")
            time.sleep(0.05)
        raise RuntimeError(f"gateway {self.n} did not {what} within {timeout_s:g}s; see {self.log_path}")

    def sigterm(self) -> None:
        """A graceful stop, as a rolling deploy does it: calls in flight are recorded and answered first."""
        self._signal(signal.SIGTERM, 90)

    def kill9(self) -> None:
        self._signal(signal.SIGKILL, 30)

    def stop(self) -> None:
        if (self.run_dir / f"gateway-{self.n}.pid").exists() and _alive(self.pid):
            try:
                self.sigterm()
            except RuntimeError:
                self.kill9()

    def _signal(self, sig: signal.Signals, timeout_s: float) -> None:
        pid = self.pid
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        self._wait(lambda: not _alive(pid), timeout_s, f"exit after {sig.name}")


def _spawn_zygote(settings: Settings, run_dir: Path, topics: dict[str, str], count: int) -> subprocess.Popen:
    with open(run_dir / "zygote.log", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "reliability.gateway_restart", "zygote", "--count", str(count),
             "--run-dir", str(run_dir), "--calls-topic", topics["calls_topic"], "--env-topic", topics["env_topic"]],
            cwd=REPO_ROOT, env=settings_env(settings), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)


class Session:
    """A harness's session in a thread: the openai SDK with the attempt's key, one call after another,
    each retried while the gateway cannot be reached."""

    def __init__(self, url: str, model: str, api_key: str) -> None:
        import openai

        self.model = model
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=60)
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": "Count with me: one."}]
        self.answered: list[str] = []  # call ids of the answers this session received, in order
        self.in_call = threading.Event()
        self.errors: list[str] = []
        self.retries = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="restart-session", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(RETRY_WINDOW_S + 30)

    def wait_for(self, count: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while len(self.answered) < count and time.monotonic() < deadline and not self.errors:
            time.sleep(0.02)
        return len(self.answered) >= count

    def _run(self) -> None:
        while not self._stop.is_set() and not self.errors:
            try:
                self._one()
            except Exception as exc:  # a refused call: the session is broken (reported)
                self.errors.append(repr(exc))
            time.sleep(THINK_S)

    def _one(self) -> None:
        import openai

        deadline = time.monotonic() + RETRY_WINDOW_S
        while True:
            self.in_call.set()
            try:
                reply = self.client.chat.completions.create(model=self.model, messages=self.messages, max_tokens=4)
                break
            except (openai.APIConnectionError, openai.InternalServerError) as exc:
                # Cannot connect, cut off mid-call, or a 5xx while the gateway goes away: a harness retries.
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the gateway did not come back within {RETRY_WINDOW_S:g}s") from exc
                self.retries += 1
                time.sleep(0.2)
            finally:
                self.in_call.clear()
        self.answered.append(reply.id.removeprefix("chatcmpl-"))
        self.messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                          {"role": "user", "content": f"next ({len(self.answered)})"}]


def _start_rollout(url: str, rollout_id: str) -> dict[str, Any]:
    started = httpx.post(f"{url}/v1/rollouts", json={"rollout_id": rollout_id, "task_input": {"count": True}},
                         timeout=60)
    started.raise_for_status()
    return started.json()


def _finish(url: str, info: dict[str, Any]) -> dict[str, Any]:
    path = f"/v1/rollouts/{info['rollout_id']}/attempts/{info['attempt_id']}/finish"
    finished = httpx.post(f"{url}{path}", json={"status": "SUCCESS"}, timeout=60,
                          headers={"Authorization": f"Bearer {info['api_key']}"})
    finished.raise_for_status()
    return finished.json()


def _assembled(records: list[tuple[str, dict[str, Any]]], rollout_id: str) -> dict[str, Any] | None:
    """The rollout the processors' pure core makes of the attempt's records (None: not complete)."""
    state = RolloutAssembly(rollout_id)
    emitted = [r for name, record in records for r in state.accept(name, record).rollouts]
    return emitted[0] if emitted else None


def gateway_restart(settings: Settings, workdir: Path, sizes: Sizes, progress: Progress) -> FaultResult:
    """Fault (d): restart a gateway process twice under a live session; see the module docstring."""
    began = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    topics = {"calls_topic": f"reliability.restart-{tag}.calls", "env_topic": f"reliability.restart-{tag}.env"}
    config = settings.kafka.client_config()
    create_topics(config, list(topics.values()))
    gw_settings = settings.gateway.model_copy(update={"host": "127.0.0.1", "port": free_port(),
                                                      "spool_dir": workdir / "spool", "admin_key": ""})
    private = settings.model_copy(update={"gateway": gw_settings})
    # The first gateway and its two successors, forked from one warm process; each takes over the address
    # when the one before it has exited.
    run_dir = workdir / "gateways"
    run_dir.mkdir(parents=True, exist_ok=True)
    zygote = _spawn_zygote(private, run_dir, topics, 3)
    url = f"http://{gw_settings.host}:{gw_settings.port}"
    chain = [ForkedGateway(url, run_dir, n, zygote) for n in range(3)]
    per_phase = max(2, sizes.calls_per_rollout)
    session: Session | None = None
    phases: list[str] = []
    finished: dict[str, Any] | None = None
    try:
        chain[0].wait_ready()
        info = _start_rollout(url, f"restart-{tag}")
        progress(f"fault i: gateway process up, rollout {info['rollout_id']} started "
                 f"({time.monotonic() - began:.0f}s)")
        session = Session(url, settings.model.name, info["api_key"])
        session.start()
        for how, old, new in (("SIGTERM", chain[0], chain[1]), ("kill -9", chain[1], chain[2])):
            new.wait_warm()
            if not session.wait_for(len(session.answered) + per_phase, 120):
                break
            session.in_call.wait(10)  # hit it mid-call where possible
            t0 = time.monotonic()
            old.sigterm() if how == "SIGTERM" else old.kill9()
            new.wait_ready()
            phases.append(f"{how}: the successor answered {time.monotonic() - t0:.1f}s later")
            progress(f"fault i: gateway replaced after {how} with {len(session.answered)} calls answered")
        session.wait_for(len(session.answered) + per_phase, 120)
        session.stop()
        finished = _finish(url, info) if not session.errors else None
    finally:
        if session is not None:
            session.stop()
        for child in chain:
            child.stop()
        try:
            zygote.wait(30)
        except subprocess.TimeoutExpired:
            zygote.kill()
            zygote.wait(30)
    try:
        expected = set(session.answered) | {info["event_id"]}
        if finished is not None:
            expected.add(finished["event_id"])
        raw = [value for value, _ in read_records(config, list(topics.values()), expected, timeout_s=60)]
    finally:
        delete_topics(config, list(topics.values()))
    named = [_decoded(value) for value in raw]
    counts = Counter(r.get("event_id", "<undecodable>") for _, r in named)
    lost, duplicated = lost_and_duplicated(counts, expected)
    calls = {r["call_index"] for name, r in named if name == "CallRecord"}
    unanswered = len({r["call_id"] for name, r in named if name == "CallRecord"} - set(session.answered))
    rollout = _assembled(named, info["rollout_id"]) if finished is not None else None
    complete = rollout is not None and rollout["status"] == "COMPLETE"
    counts_match = finished is not None and finished["call_count"] == len(calls) and calls == set(range(len(calls)))
    passed = lost == duplicated == 0 and not session.errors and len(phases) == 2 and complete and counts_match
    stated = finished["call_count"] if finished else "-"
    detail = "; ".join([*phases, f"{session.retries} client retries", f"{unanswered} recorded but unanswered",
                        f"finish call_count {stated} vs {len(calls)} calls on Kafka",
                        "rollout COMPLETE" if complete else "rollout NOT complete", *session.errors[:2]])
    progress(f"fault i: lost {lost}, duplicated {duplicated}; {detail}")
    return FaultResult(NAME, f"one session of {len(session.answered)} calls, gateway restarted twice under it",
                       lost, duplicated, passed, detail, seconds=time.monotonic() - began)


def _decoded(value: bytes) -> tuple[str, dict[str, Any]]:
    try:
        return get_codec().decode(value)
    except DecodeError:
        return "<undecodable>", {}


# ------------------------------------------------------------------------------------ the child


def _zygote(args: argparse.Namespace) -> int:
    """Warm up once (imports, the model's text side), then fork the chain of gateways and reap them."""
    import logging

    import torch  # noqa: F401  (imported once here, shared by every fork; no torch work before forking)

    from producers.gateway.wiring import make_text_side
    from tokentrail.settings import get_settings

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = get_settings()
    text = make_text_side(settings, progress=lambda line: print(line, flush=True))
    run_dir = Path(args.run_dir)
    children: list[int] = []
    for n in range(args.count):
        after = children[-1] if children else None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _forked_gateway(args, settings, text, n, after)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children.append(pid)
        (run_dir / f"gateway-{n}.pid").write_text(str(pid))
    while children:  # reap each as it exits, so its successor sees it gone at once
        pid, _ = os.wait()
        if pid in children:
            children.remove(pid)
    return 0


def _forked_gateway(args: argparse.Namespace, settings: Settings, text: Any, n: int, after_pid: int | None) -> int:
    import socket

    import uvicorn

    from producers.gateway.wiring import build_app

    run_dir = Path(args.run_dir)
    log = os.open(run_dir / f"gateway-{n}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    app = build_app(settings, text=text, topics={"calls_topic": args.calls_topic, "env_topic": args.env_topic},
                    progress=lambda line: print(line, flush=True))
    (run_dir / f"gateway-{n}.warm").touch()
    if after_pid is not None:
        print(f"warm; waiting for process {after_pid} to exit", flush=True)
        while _alive(after_pid):
            time.sleep(0.02)
    g = settings.gateway
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    deadline = time.monotonic() + 30
    while True:
        try:
            sock.bind((g.host, g.port))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    print(f"gateway {n} (pid {os.getpid()}) serving on http://{g.host}:{g.port}", flush=True)
    config = uvicorn.Config(app, host=g.host, port=g.port, log_level="warning", timeout_graceful_shutdown=60)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability.gateway_restart",
                                     description="The gateway child of fault (d): a gateway on the given topics.")
    sub = parser.add_subparsers(dest="command", required=True)
    zygote = sub.add_parser("zygote", help="warm up once, then fork COUNT gateways on these topics, each taking "
                            "over the address (settings from TOKENTRAIL_*) when the one before it has exited")
    zygote.add_argument("--calls-topic", required=True)
    zygote.add_argument("--env-topic", required=True)
    zygote.add_argument("--count", type=int, default=3)
    zygote.add_argument("--run-dir", required=True, help="pid, warm and log files of each gateway")
    zygote.set_defaults(run=_zygote)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
