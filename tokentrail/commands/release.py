"""``tokentrail release status|start|promote|rollback|pin``: safe policy release by decisions on a topic.

The topic (``tokentrail.release-decisions``) is the release's only state: ``status`` reads it to its end
and folds the decisions (``processors.release.events.DecisionLog``); the other actions fold it the same
way, make an operator's decision on that state with the pure core (``processors.release.controller``),
write it as a ReleaseDecision and read the topic again to show that it took effect (a decision that
lost a race with another writer is kept on the topic but changes nothing; the command then says so
and exits 1). docs/release.md describes the plan, the test and the events.
"""

from __future__ import annotations

import argparse
import getpass
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from processors.errors import ConfigError
from processors.release.controller import (
    Decision,
    ReleaseError,
    ReleaseState,
    initial_state,
    manual_decision,
    pin_decision,
    start_decision,
)
from processors.release.events import DecisionLog, Record, decision_record
from processors.release.plan import load_plan
from processors.stream.release_controller import (
    ControllerTopics,
    ReleaseTopicError,
    publish_decision,
    read_decisions,
    run_controller,
)
from schemas.topics import CALLS_TOPIC, RELEASE_DECISIONS_TOPIC, REWARDS_TOPIC
from tokentrail.errors import CliError
from tokentrail.settings import Settings, get_settings

_DESCRIPTION = """\
Which policy versions serve which share of sessions, as immutable ReleaseDecision events on a topic of
their own. `start` begins a release of a candidate at the plan's first ramp stage; the release
controller ramps, promotes or rolls back by its sequential test; `promote`, `rollback` and `pin` are an
operator's decisions, recorded like the controller's. See docs/release.md."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "release", help="safe policy release: status | start | promote | rollback | pin",
        description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="release_action", metavar="ACTION", required=True)

    topic = argparse.ArgumentParser(add_help=False)
    topic.add_argument("--topic", default=RELEASE_DECISIONS_TOPIC,
                       help=f"the decisions topic (default: {RELEASE_DECISIONS_TOPIC})")
    topic.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                       help="reading the topic to its end (default: settings release.read_timeout_s)")
    common = argparse.ArgumentParser(add_help=False, parents=[topic])
    common.add_argument("--model", default=None,
                        help="the release track, the served model name (default: settings release.model, "
                             "else model.name)")
    deciding = argparse.ArgumentParser(add_help=False, parents=[common])
    deciding.add_argument("--operator", default=None,
                          help="who decides (default: settings release.operator, else the login name)")
    deciding.add_argument("--reason", default="", help="why, in words (recorded in the decision)")

    p = actions.add_parser("status", parents=[common], help="the current state of each release track",
                           description="Read the decisions topic and print each track's serving version, "
                                       "candidate and share, pins, and the last decision with its counts, "
                                       "means and interval.")
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    p.set_defaults(func=_cmd_status)

    p = actions.add_parser("start", parents=[deciding], help="start releasing a candidate version",
                           description="Start a release: the candidate gets the plan's first ramp fraction of "
                                       "sessions; the controller takes it from there.")
    p.add_argument("--candidate", type=int, required=True, help="the candidate policy version")
    p.add_argument("--serving", type=int, default=None,
                   help="the serving policy version (required for a track's first release)")
    p.add_argument("--plan", type=Path, default=None,
                   help="the release plan YAML (default: settings release.plan, deploy/config/release.yaml)")
    p.set_defaults(func=_cmd_start)

    for action, text in (("promote", "give the candidate all traffic now; it becomes the serving version"),
                         ("rollback", "take the candidate out of traffic now; serving stays")):
        p = actions.add_parser(action, parents=[deciding], help=text, description=text[0].upper() + text[1:] + ".")
        p.set_defaults(func=_cmd_manual, action=action)

    p = actions.add_parser(
        "control", parents=[topic], help="run the release controller (a stream processor)",
        description="Read calls and rewards, compare each release's candidate with its serving version by "
                    "the plan's sequential test, and write ramp, promote and rollback decisions. Rebuilds its "
                    "state from the topics on every start; run one instance.")
    p.add_argument("--calls-topic", default=CALLS_TOPIC, help=f"the calls topic (default: {CALLS_TOPIC})")
    p.add_argument("--rewards-topic", default=REWARDS_TOPIC, help=f"the rewards topic (default: {REWARDS_TOPIC})")
    p.add_argument("--idle-timeout", type=float, default=None, metavar="SECONDS",
                   help="stop after this long without a record (default: run until interrupted)")
    p.add_argument("--progress-every", type=float, default=10.0, metavar="SECONDS",
                   help="print counts and each track's state this often (default: 10)")
    p.set_defaults(func=_cmd_control)

    p = actions.add_parser("pin", parents=[deciding], help="route a traffic label to a fixed version",
                           description="Pin a traffic label (evaluation suites, internal users) to a policy "
                                       "version whatever the ramp, or clear a pin.")
    p.add_argument("--label", required=True, help="the traffic label")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--version", type=int, help="the policy version the label is served")
    which.add_argument("--clear", action="store_true", help="remove the label's pin")
    p.set_defaults(func=_cmd_pin)


# ---- commands --------------------------------------------------------------------------------------


def _cmd_status(args: argparse.Namespace) -> int:
    settings = get_settings()
    log = _read_log(settings, args)
    models = [_model(settings, args)] if args.model else sorted(log.states)
    last = {r["model"]: r for r in log.applied}
    if args.json:
        print(json.dumps({"topic": args.topic, "tracks": {m: _summary(log.states.get(m), last.get(m))
                                                          for m in models},
                          "stale_decisions": len(log.stale)}, sort_keys=True))
        return 0
    if not models or all(m not in log.states for m in models):
        print(f"no release decisions on {args.topic}" + (f" for model {models[0]!r}" if models else ""))
        return 0
    for model in models:
        if model in log.states:
            _print_state(log.states[model], last[model])
    if log.stale:
        print(f"{len(log.stale)} decision(s) lost a race with another and changed nothing")
    return 0


def _cmd_start(args: argparse.Namespace) -> int:
    settings = get_settings()
    model = _model(settings, args)
    try:
        plan = load_plan(args.plan or settings.release.plan)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    log = _read_log(settings, args)
    state = log.states.get(model)
    if state is None:
        if args.serving is None:
            raise CliError(f"model {model!r} has no release decisions yet: give its serving version with --serving")
        state = _checked(lambda: initial_state(model, plan, args.serving))
    elif args.serving is not None and args.serving != state.serving_version:
        raise CliError(f"model {model!r} serves version {state.serving_version}, not {args.serving}")
    decision = _checked(lambda: start_decision(state, args.candidate, _operator(settings, args), args.reason, plan))
    return _write(settings, args, state, decision)


def _cmd_manual(args: argparse.Namespace) -> int:
    settings = get_settings()
    state = _state(settings, args)
    decision = _checked(lambda: manual_decision(state, args.action, _operator(settings, args), args.reason))
    return _write(settings, args, state, decision)


def _cmd_pin(args: argparse.Namespace) -> int:
    settings = get_settings()
    state = _state(settings, args)
    version = None if args.clear else args.version
    decision = _checked(lambda: pin_decision(state, args.label, version, _operator(settings, args), args.reason))
    return _write(settings, args, state, decision)


def _cmd_control(args: argparse.Namespace) -> int:
    settings = get_settings()
    topics = ControllerTopics(args.calls_topic, args.rewards_topic, args.topic)
    # SIGTERM (a service manager, the demo) stops it cleanly: it prints its last counts within one poll.
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _sig, _frame: stop.set())
    try:
        feed = run_controller(settings.kafka, topics, idle_s=args.idle_timeout, progress_every_s=args.progress_every,
                              timeout_s=_timeout(settings, args), log=lambda line: print(line, flush=True),
                              should_stop=stop.is_set, reward_source=settings.release.reward_source)
    except KafkaException as exc:
        raise CliError(f"the controller stopped on a Kafka error: {exc.args[0].str()}") from None
    except ReleaseTopicError as exc:
        raise CliError(str(exc)) from None
    for reason, count in sorted(feed.skipped.items()):
        print(f"controller: skipped {count} x {reason}")
    return 0


# ---- helpers ---------------------------------------------------------------------------------------


def _checked(make: Any) -> Any:
    try:
        return make()
    except ReleaseError as exc:
        raise CliError(str(exc)) from None


def _model(settings: Settings, args: argparse.Namespace) -> str:
    return args.model or settings.release.model or settings.model.name


def _operator(settings: Settings, args: argparse.Namespace) -> str:
    return args.operator or settings.release.operator or getpass.getuser()


def _timeout(settings: Settings, args: argparse.Namespace) -> float:
    return args.timeout if args.timeout is not None else settings.release.read_timeout_s


def _state(settings: Settings, args: argparse.Namespace) -> ReleaseState:
    model = _model(settings, args)
    state = _read_log(settings, args).states.get(model)
    if state is None:
        raise CliError(f"model {model!r} has no release decisions on {args.topic}: `tokentrail release start` first")
    return state


def _read_log(settings: Settings, args: argparse.Namespace) -> DecisionLog:
    print(f"reading {args.topic} ...", file=sys.stderr)
    try:
        read = read_decisions(settings.kafka, args.topic, _timeout(settings, args))
    except KafkaException as exc:
        raise CliError(f"cannot read {args.topic}: {exc.args[0].str()}") from None
    except ReleaseTopicError as exc:
        raise CliError(str(exc)) from None
    log = DecisionLog.fold(read.records)
    for reason in [*read.unreadable, *(why for _, why in log.rejected)]:
        print(f"skipped a record on {args.topic}: {reason}", file=sys.stderr)
    return log


def _write(settings: Settings, args: argparse.Namespace, state: ReleaseState, decision: Decision) -> int:
    record, _after = decision_record(state, decision, created_at_us=time.time_ns() // 1000)
    try:
        publish_decision(settings.kafka, args.topic, record)
    except KafkaException as exc:
        raise CliError(f"cannot write the decision to {args.topic}: {exc.args[0].str()}") from None
    except ReleaseTopicError as exc:
        raise CliError(str(exc)) from None
    log = _read_log(settings, args)
    if any(r["event_id"] == record["event_id"] for r in log.stale):
        print(f"decision {record['sequence']} ({record['action']}) lost a race with another decision and changed "
              "nothing; run `tokentrail release status` and decide again", file=sys.stderr)
        return 1
    print(f"decision {record['sequence']} on {state.model!r}: {record['action']} ({record['event_id']})")
    _print_state(log.states[state.model], record)
    return 0


def _summary(state: ReleaseState | None, last: Record | None) -> dict[str, Any] | None:
    if state is None or last is None:
        return None
    return {
        "serving_version": state.serving_version, "candidate_version": state.candidate_version,
        "candidate_fraction": state.candidate_fraction, "stage": state.stage, "release_id": state.release_id,
        "pinned": dict(state.pinned), "plan_id": state.plan.plan_id, "decisions": state.sequence,
        "last_decision": {k: last[k] for k in (
            "event_id", "sequence", "action", "source", "operator", "rule", "reason", "serving_version",
            "candidate_version", "alpha", "interval_low", "interval_high", "serving_rewards",
            "serving_reward_mean", "candidate_rewards", "candidate_reward_mean", "created_at_us")},
    }


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def _print_state(state: ReleaseState, last: Record) -> None:
    if state.candidate_version is None:
        traffic = f"serving version {state.serving_version} to all sessions"
    else:
        traffic = (f"serving version {state.serving_version}, candidate {state.candidate_version} at "
                   f"{state.candidate_fraction:.0%} (stage {state.stage + 1} of {len(state.plan.ramp)})")
    pins = ", ".join(f"{k}->{v}" for k, v in sorted(state.pinned.items())) or "none"
    print(f"{state.model}: {traffic}; pinned: {pins}; plan {state.plan.name} ({state.plan.plan_id})")
    who = last["operator"] if last["source"] == "operator" else "controller"
    print(f"  last decision {last['sequence']}: {last['action']} by {who}, rule {last['rule']}: {last['reason']}")
    if last["serving_rewards"] or last["candidate_rewards"]:
        print(f"  rewards: serving {last['serving_rewards']} (mean {_fmt(last['serving_reward_mean'])}), candidate "
              f"{last['candidate_rewards']} (mean {_fmt(last['candidate_reward_mean'])}); difference interval "
              f"[{_fmt(last['interval_low'])}, {_fmt(last['interval_high'])}] at alpha {_fmt(last['alpha'])}")
