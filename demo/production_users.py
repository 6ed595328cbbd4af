"""The simulated end users of ``tokentrail demo --production`` (``demo/production.py``): how a user judges the answer
it got and which feedback it plans (pure), and the users themselves (shell): threads that hold sessions with the demo
agent through the official ``openai`` SDK and an outbox that sends each planned feedback to ``POST /v1/feedback``
when it is due.
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import openai

from demo.agent import converse
from demo.environment import LookupTask, make_task
from demo.forgetting import CanaryNotes, make_canary
from producers.sdk import send_feedback
from schemas.ids import call_id

KINDS = ("BINARY", "RATING", "OUTCOME", "TASK_OUTCOME")
SOURCE = "demo-users"

# ---------------------------------------------------------------- the simulated user's judgement (pure)


def edit_distance(answer: str, wanted: str) -> float:
    """Levenshtein distance between the two, over the longer one's length (0 = same, 1 = nothing kept)."""
    if answer == wanted:
        return 0.0
    previous = list(range(len(wanted) + 1))
    for i, a in enumerate(answer, start=1):
        current = [i]
        for j, w in enumerate(wanted, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a != w)))
        previous = current
    return previous[-1] / max(len(answer), len(wanted))


@dataclass(frozen=True)
class PlannedFeedback:
    """One feedback a user gives about a session's answer ``event_offset_s`` after the session ends; it
    reaches the gateway ``delay_s`` after the session ends (later for late feedback)."""

    kind: str
    fields: dict[str, Any]
    event_offset_s: float
    delay_s: float
    # Given in time but delivered after the join's window closed (an offline client, a queued webhook):
    # recorded late by the stream; replay, going by event time, uses it.
    late: bool


def feedback_fields(kind: str, answer: str, wanted: str) -> dict[str, Any]:
    """What a user who knows the right answer says about ``answer`` in feedback of ``kind``."""
    right = answer.strip().lower() == wanted
    if kind == "BINARY":
        return {"binary": right}
    if kind == "RATING":  # 1..5 stars: right 5, close 2-4 by how much is kept, else 1
        stars = 5.0 if right else round(1 + 3 * (1 - edit_distance(answer.strip().lower(), wanted)))
        return {"rating": stars, "rating_scale": [1.0, 5.0]}
    if kind == "OUTCOME":  # the user keeps, fixes or throws away the answer
        if right:
            return {"outcome": "ACCEPTED"}
        if not answer.strip():
            return {"outcome": "REJECTED"}
        return {"outcome": "EDITED", "edit_distance": round(edit_distance(answer.strip().lower(), wanted), 4)}
    if kind == "TASK_OUTCOME":
        return {"task_success": right, "details": {"wanted": wanted, "answered": answer[:200]}}
    raise ValueError(f"no feedback kind {kind!r}")


def plan_feedback(answer: str, wanted: str, rng: random.Random, *, late_fraction: float, wait_s: float,
                  lag_s: float) -> list[PlannedFeedback]:
    """One or two kinds of feedback for a session, given well inside the join's wait. A late session's
    feedback all arrives after its window closed, so its stream reward has none and replay's differs."""
    late = rng.random() < late_fraction
    kinds = rng.sample(KINDS, k=rng.choice((1, 2)))
    planned = []
    for kind in kinds:
        given = round(rng.uniform(0.5, 0.35 * wait_s), 3)
        # Late arrival: past the window end (the kind's wait after the close) and the watermark lag, with
        # room for the stream's own delays.
        arrives = round(wait_s + lag_s + rng.uniform(10.0, 20.0), 3) if late else given
        planned.append(PlannedFeedback(kind, feedback_fields(kind, answer, wanted), given, arrives, late))
    return planned

# ---------------------------------------------------------------- the users (shell)


@dataclass
class SessionOutcome:
    user: str
    task_id: str
    response_ids: list[str]
    answer: str
    right: bool
    ended_by: str  # "request" | "idle"
    rollout_id: str | None  # known to the demo when the session was ended by request


@dataclass
class SentFeedback:
    event_id: str
    kind: str
    late: bool
    target: str


class FeedbackOutbox:
    """Sends planned feedback when it is due, on one thread; records what was sent."""

    def __init__(self, gateway_url: str) -> None:
        self.gateway_url = gateway_url
        self._queue: list[tuple[float, int, dict[str, str], PlannedFeedback, float]] = []
        self._serial = 0
        self._cv = threading.Condition()
        self._closing = False
        self.sent: list[SentFeedback] = []
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="demo-feedback", daemon=True)
        self._http = httpx.Client(timeout=60.0)

    def start(self) -> None:
        self._thread.start()

    def schedule(self, due: float, target: dict[str, str], planned: PlannedFeedback, event_time: float) -> None:
        with self._cv:
            self._serial += 1
            heapq.heappush(self._queue, (due, self._serial, target, planned, event_time))
            self._cv.notify()

    def pending(self) -> int:
        with self._cv:
            return len(self._queue)

    def close(self, timeout_s: float) -> None:
        """Send everything still planned (waiting until it is due), then stop."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join(timeout_s)
        self._http.close()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:
                    return
                due, _, target, planned, event_time = self._queue[0]
                wait = due - time.time()
                if wait > 0:
                    self._cv.wait(min(wait, 1.0))
                    continue
                heapq.heappop(self._queue)
            self._send(target, planned, event_time)

    def _send(self, target: dict[str, str], planned: PlannedFeedback, event_time: float) -> None:
        try:  # event_time: when the user gave it (a retried POST would keep its id)
            sent = send_feedback(self.gateway_url, target, planned.kind, client=self._http, source=SOURCE,
                                 event_time=event_time, **planned.fields)
        except Exception as exc:  # reported at the end; the run goes on
            self.errors.append(f"{planned.kind}: {exc!r}"[:300])
            return
        self.sent.append(SentFeedback(sent["event_id"], planned.kind, planned.late, next(iter(target.values()))))


class Users:
    """``count`` simulated users, each running sessions (one lookup question each) until the deadline."""

    def __init__(self, gateway_url: str, model: str, count: int, outbox: FeedbackOutbox, *, seed: int,
                 idle_s: float, late_fraction: float, wait_s: float, lag_s: float, explicit_end: float,
                 canaries: bool = False) -> None:
        self.gateway_url, self.model, self.count, self.outbox = gateway_url, model, count, outbox
        self.idle_s, self.late_fraction, self.wait_s, self.lag_s = idle_s, late_fraction, wait_s, lag_s
        self.explicit_end, self.seed = explicit_end, seed
        self.outcomes: list[SessionOutcome] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._next_task = seed
        # --forget: each user's own canary (in its first session), and the users stopped before their forget.
        self.canaries = {self.user_name(n): make_canary(self.user_name(n)) for n in range(count)} if canaries else {}
        self.canary_notes = CanaryNotes(self.canaries)  # planted in each user's first session
        self._retired: set[int] = set()
        self._exited = {n: threading.Event() for n in range(count)}

    @staticmethod
    def user_name(n: int) -> str:
        return f"demo-user-{n}"

    def retire(self, users: list[int], timeout_s: float) -> None:
        """Stop these users after their current session; returns once they stopped (or ``timeout_s``)."""
        with self._lock:
            self._retired.update(users)
        deadline = time.monotonic() + timeout_s
        for n in users:
            self._exited[n].wait(max(0.0, deadline - time.monotonic()))

    def run_until(self, deadline: float, on_tick: Callable[[], None]) -> None:
        with ThreadPoolExecutor(max_workers=self.count, thread_name_prefix="user") as pool:
            futures = [pool.submit(self._user, n, deadline) for n in range(self.count)]
            last_tick = time.monotonic()
            while not all(f.done() for f in futures):  # after the deadline: each user ends its session
                time.sleep(1.0)
                if time.monotonic() - last_tick >= 10:
                    on_tick()
                    last_tick = time.monotonic()
            for future in futures:
                future.result()

    def _task(self) -> LookupTask:
        with self._lock:
            self._next_task += 1
            return make_task(self._next_task)

    def _user(self, n: int, deadline: float) -> None:
        try:
            self._sessions(n, deadline)
        finally:
            self._exited[n].set()

    def _sessions(self, n: int, deadline: float) -> None:
        user = self.user_name(n)
        rng = random.Random(self.seed * 1000 + n)
        client = openai.OpenAI(base_url=f"{self.gateway_url}/v1", api_key="demo-user", max_retries=0,
                               timeout=180.0)
        while time.monotonic() < deadline and n not in self._retired:
            try:
                outcome = self._session(client, user, self._task(), rng)
            except Exception as exc:  # a failed session is reported, the user goes on
                with self._lock:
                    self.errors.append(repr(exc)[:300])
                time.sleep(self.idle_s + 1)  # its window ends by the idle gap
                continue
            with self._lock:
                self.outcomes.append(outcome)
            ended = time.time()
            for planned in plan_feedback(outcome.answer, make_task_answer(outcome), rng,
                                         late_fraction=self.late_fraction, wait_s=self.wait_s, lag_s=self.lag_s):
                # Idle-ended sessions close idle_s later: late arrival is counted from that close.
                base = ended + (self.idle_s if outcome.ended_by == "idle" and planned.late else 0.0)
                self.outbox.schedule(base + planned.delay_s, {"response_id": outcome.response_ids[-1]}, planned,
                                     event_time=ended + planned.event_offset_s)
            time.sleep(rng.uniform(0.2, 1.0))  # the user reads the answer

    def _session(self, client: openai.OpenAI, user: str, task: LookupTask, rng: random.Random) -> SessionOutcome:
        """One conversation: no rollout is created; ``user`` is the session key."""
        # The agent runs its tool itself: no environment API.
        answer, response_ids = converse(client, self.model, task, max_tokens=24, temperature=1.0, user=user,
                                        note=self.canary_notes.note(user))
        rollout_id = None
        if rng.random() < self.explicit_end:  # the app says the conversation is over
            ended = httpx.post(f"{self.gateway_url}/v1/sessions/{quote(user, safe='')}/end", timeout=120.0)
            ended.raise_for_status()
            rollout_id, how = ended.json()["rollout_id"], "request"
        else:  # the user goes quiet: the idle gap ends the window before their next session
            time.sleep(self.idle_s + 1.5)
            how = "idle"
        return SessionOutcome(user, task.task_id, response_ids, answer, answer.strip().lower() == task.answer, how,
                              rollout_id)


def make_task_answer(outcome: SessionOutcome) -> str:
    return make_task(int(outcome.task_id.removeprefix("lookup-"))).answer


def unknown_response_id(n: int) -> str:
    """A well-formed response id of a call that never happened (a stale client): unmatched feedback."""
    return "chatcmpl-" + call_id("session-nobody", f"stale-{n}", 0)
