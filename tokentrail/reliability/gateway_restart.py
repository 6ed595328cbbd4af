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

    python -m tokentrail.reliability.gateway_restart serve --calls-topic T --env-topic E [--after-pid N]

runs the gateway child (settings from the TOKENTRAIL_* environment; port and spool from them); with
``--after-pid`` it warms up first and takes over the address once that process has exited.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from processors.assembler import RolloutAssembly
from schemas.codec import DecodeError, get_codec
from tokentrail.commands.process import settings_env
from tokentrail.reliability.faults import GatewayProcess, Progress, Sizes, free_port
from tokentrail.reliability.kafka_read import create_topics, delete_topics, lost_and_duplicated, read_records
from tokentrail.reliability.results import FaultResult
from tokentrail.settings import REPO_ROOT, Settings

# Issue 17's fault (d); "i" in the table, after the letters the other faults already use.
NAME = "i. gateway restarted mid-session (SIGTERM, kill -9)"
# How long a client keeps retrying a call that cannot connect (a gateway starting up takes seconds).
RETRY_WINDOW_S = 180.0
THINK_S = 0.05  # the harness's own work between calls (tools, parsing)


class GatewayChild(GatewayProcess):
    """A gateway process on the given topics (``serve`` below). A successor is spawned while its predecessor
    still serves: it warms up (imports, model, tokenizer), says so in ``ready_file``, waits for the
    predecessor to exit, then takes over the address, rebuilds the attempts from Kafka and serves (a
    rolling deploy on one host)."""

    def __init__(self, settings: Settings, log_path: Path, topics: dict[str, str]) -> None:
        super().__init__(settings, log_path)
        self.topics = topics
        self.ready_file = log_path.with_suffix(f".{uuid.uuid4().hex[:6]}.warm")

    def spawn(self, after_pid: int | None = None) -> None:
        command = [sys.executable, "-m", "tokentrail.reliability.gateway_restart", "serve",
                   "--calls-topic", self.topics["calls_topic"], "--env-topic", self.topics["env_topic"],
                   "--ready-file", str(self.ready_file)]
        if after_pid is not None:
            command += ["--after-pid", str(after_pid)]
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(command, cwd=REPO_ROOT, env=settings_env(self.settings),
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)

    def wait_warm(self, timeout_s: float = 300.0) -> None:
        self._wait(lambda: self.ready_file.exists(), timeout_s, "warm up")

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        def answers() -> bool:
            try:
                return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        self._wait(answers, timeout_s, "answer")

    def _wait(self, done: Any, timeout_s: float, what: str) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the gateway exited with {self.proc.returncode}; see {self.log_path}")
            if done():
                return
            time.sleep(0.1)
        raise RuntimeError(f"the gateway did not {what} within {timeout_s:g}s; see {self.log_path}")

    def start(self, timeout_s: float = 300.0) -> None:
        self.spawn()
        self.wait_ready(timeout_s)

    def sigterm(self) -> None:
        """A graceful stop, as a rolling deploy does it: calls in flight are recorded and answered first."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(90)


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
    # The first gateway and its two successors, warming up together; each takes over when the one before
    # it has exited.
    chain = [GatewayChild(private, workdir / f"gateway-{n}.log", topics) for n in range(3)]
    per_phase = max(2, sizes.calls_per_rollout)
    session: Session | None = None
    phases: list[str] = []
    finished: dict[str, Any] | None = None
    try:
        for n, child in enumerate(chain):
            child.spawn(after_pid=chain[n - 1].proc.pid if n and chain[n - 1].proc else None)
        chain[0].wait_ready()
        info = _start_rollout(chain[0].url, f"restart-{tag}")
        progress(f"fault i: gateway process up, rollout {info['rollout_id']} started "
                 f"({time.monotonic() - began:.0f}s)")
        session = Session(chain[0].url, settings.model.name, info["api_key"])
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
        finished = _finish(chain[2].url, info) if not session.errors else None
    finally:
        if session is not None:
            session.stop()
        for child in chain:
            child.stop()
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


def _serve(args: argparse.Namespace) -> int:
    import logging
    import socket

    import uvicorn

    from producers.gateway.wiring import build_app
    from tokentrail.settings import get_settings

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = get_settings()
    app = build_app(settings, topics={"calls_topic": args.calls_topic, "env_topic": args.env_topic},
                    progress=lambda line: print(line, flush=True))
    if args.ready_file:
        Path(args.ready_file).touch()
    if args.after_pid:
        print(f"warm; waiting for process {args.after_pid} to exit", flush=True)
        while _alive(args.after_pid):
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
    print(f"serving on http://{g.host}:{g.port} (calls {args.calls_topic}, env {args.env_topic})", flush=True)
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
    parser = argparse.ArgumentParser(prog="python -m tokentrail.reliability.gateway_restart",
                                     description="The gateway child of fault (d): a gateway on the given topics.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a gateway (settings from TOKENTRAIL_*) on these topics")
    serve.add_argument("--calls-topic", required=True)
    serve.add_argument("--env-topic", required=True)
    serve.add_argument("--after-pid", type=int, default=None,
                       help="warm up, then wait for this process to exit before taking over the address")
    serve.add_argument("--ready-file", default="", help="touched once warm (the app is built)")
    serve.set_defaults(run=_serve)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
