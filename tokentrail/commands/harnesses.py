"""``tokentrail harnesses check``: real agent harnesses, unchanged, through the gateway (issue 18, item 8).

Each harness (Pi over OpenAI chat, Claude Code over Anthropic Messages, Codex CLI over Responses:
tokentrail/commands/harness_codex.py, OpenClaw over OpenAI chat: tokentrail/commands/harness_openclaw.py) does a
scripted task in a throwaway HOME and working directory: a rollout with a ``script`` (the engine emits the given
completions under the model, recorded ``scripted``), two shell-tool runs, then an answer. From the calls topic:
every call OK and token-exact (its prompt decodes to a fresh render of the request it recorded), its output decodes
to the scripted text the harness received, the attempt assembles COMPLETE (the processors' assembler), and how many
calls extend the previous call's prompt ‖ output exactly (spliced), with the named causes of every prefix break
(tokentrail/commands/harness_breaks.py). A harness not run yet is listed as not passing, with the reason.

Starts a gateway of its own on a free port, on the harness model variant (spec ``harness``), unless
``--gateway URL`` names one (which must serve a model whose context holds the harnesses' prompts and map
their model names, ``gateway.model_aliases``, and publish to ``--calls-topic`` / ``--env-topic``). Harness
binaries: ``make setup-harnesses``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokentrail.settings import Settings, get_settings

REPO = Path(__file__).resolve().parents[2]
ENV_SH = REPO / "deploy" / "harnesses" / "env.sh"
TASK = "Create hi.txt containing hello with a shell command, count its bytes, then answer."
WRITE, COUNT, ANSWER = "echo hello > hi.txt && cat hi.txt", "wc -c < hi.txt", "hi.txt says hello, in 6 bytes."
API_KEY = "tokentrail-harness-check"
# Harnesses the check lists as not passing, with the reason (none: all four run through the gateway).
NOT_YET: dict[str, str] = {}


def _tool_call(name: str, arguments: dict[str, str]) -> str:
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {json.dumps(arguments)}}}\n</tool_call>'


@dataclass(frozen=True)
class Harness:
    name: str
    protocol: str
    script: list[str]
    # (gateway root of the rollout, rollout's api key, HOME, work dir) -> (argv, extra environment)
    command: Callable[[str, str, Path, Path, str], tuple[list[str], dict[str, str]]]


def _pi(root: str, key: str, home: Path, work: Path, model: str) -> tuple[list[str], dict[str, str]]:
    agent_dir = home / ".pi" / "agent"
    agent_dir.mkdir(parents=True, exist_ok=True)
    (agent_dir / "models.json").write_text(json.dumps({"providers": {"gateway": {
        "baseUrl": f"{root}/v1", "api": "openai-completions", "apiKey": key,
        "compat": {"supportsDeveloperRole": False}, "models": [{"id": model}]}}}))
    return ["pi", "-p", TASK, "--model", f"gateway/{model}"], {}


def _openclaw(root: str, key: str, home: Path, work: Path, model: str) -> tuple[list[str], dict[str, str]]:
    from tokentrail.commands.harness_openclaw import openclaw_command

    return openclaw_command(root, key, home, work, model, TASK)


def _codex(root: str, key: str, home: Path, work: Path, model: str) -> tuple[list[str], dict[str, str]]:
    from tokentrail.commands.harness_codex import codex_command

    return codex_command(root, key, home, work, model, TASK)


def _claude(root: str, key: str, home: Path, work: Path, model: str) -> tuple[list[str], dict[str, str]]:
    return (["claude", "-p", TASK, "--output-format", "json", "--max-turns", "4", "--allowedTools", "Bash"],
            {"ANTHROPIC_BASE_URL": root, "ANTHROPIC_AUTH_TOKEN": key})


HARNESSES = {
    "pi": Harness("pi", "openai.chat", [_tool_call("bash", {"command": WRITE}),
                                        _tool_call("bash", {"command": COUNT}), ANSWER], _pi),
    "claude": Harness("claude", "anthropic.messages",
                      [_tool_call("Bash", {"command": WRITE, "description": "Write hi.txt"}),
                       _tool_call("Bash", {"command": COUNT, "description": "Count its bytes"}), ANSWER], _claude),
    "codex": Harness("codex", "openai.responses", [_tool_call("exec_command", {"cmd": WRITE}),
                                                   _tool_call("exec_command", {"cmd": COUNT}), ANSWER], _codex),
    "openclaw": Harness("openclaw", "openai.chat", [_tool_call("exec", {"command": WRITE}),
                                                    _tool_call("exec", {"command": COUNT}), ANSWER], _openclaw),
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("harnesses", help="real agent harnesses through the gateway")
    sub = parser.add_subparsers(dest="harnesses_command", metavar="ACTION")
    check = sub.add_parser("check", help="run each harness on a scripted tool task; check every call")
    check.add_argument("--gateway", default=None, help="a running gateway's URL (default: start one)")
    check.add_argument("--only", default=",".join(HARNESSES), help="comma-separated harnesses to run")
    check.add_argument("--timeout-s", type=float, default=900.0, help="per harness run")
    check.add_argument("--calls-topic", default=None, help="the gateway's calls topic (default: tokentrail's)")
    check.add_argument("--env-topic", default=None, help="the gateway's env topic (default: tokentrail's)")
    check.set_defaults(func=_cmd_check)
    parser.set_defaults(func=lambda _args: parser.print_help() or 2)


def _run(harness: Harness, gateway_url: str, model: str, timeout_s: float) -> tuple[str, dict[str, Any], str]:
    """Run one harness in a rollout; returns (rollout id, the finish answer, the harness's failure or '')."""
    from producers.sdk import Rollout

    with tempfile.TemporaryDirectory(prefix=f"tokentrail-{harness.name}-") as tmp:
        home, work = Path(tmp) / "home", Path(tmp) / "work"
        home.mkdir()
        work.mkdir()
        with Rollout(gateway_url, task_input={"harness": harness.name}, script=harness.script) as rollout:
            argv, extra = harness.command(rollout.anthropic_base_url, rollout.api_key, home, work, model)
            env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
            env.update({"HOME": str(home), "NO_PROXY": "127.0.0.1,localhost", "XDG_CONFIG_HOME": str(home / ".config"),
                        "XDG_CACHE_HOME": str(home / ".cache"), **extra})
            shell = f'. {ENV_SH} && exec "$@"'
            done = subprocess.run(["bash", "-c", shell, "bash", *argv], cwd=work, env=env, capture_output=True,
                                  text=True, timeout=timeout_s)
            failure = "" if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.strip()[-300:]}"
            if not failure and (work / "hi.txt").read_text() != "hello\n":
                failure = "the tool did not write hi.txt"
            if not failure and ANSWER not in done.stdout:
                failure = "the answer did not reach the harness's output"
            finished = rollout.finish("SUCCESS" if not failure else "FAILURE", {"stdout": done.stdout[-2000:]})
            return rollout.rollout_id, finished, failure


def _records(settings: Settings, topic: str, rollout_id: str, count: int, kind: str | None = None,
             timeout_s: float = 120.0) -> list[tuple[str, dict[str, Any]]]:
    from testkit.kafka_read import first_records

    return first_records(settings.kafka, topic, count, timeout_s=timeout_s,
                         where=lambda name, r: (kind is None or name == kind) and r.get("rollout_id") == rollout_id)


def _prompts(calls: list[dict[str, Any]]) -> list[Any]:
    from schemas.prompt_delta import reconstruct_prompt
    from schemas.tokens import unpack_ids

    by_id = {c["call_id"]: c for c in calls}
    done: dict[str, Any] = {}

    def sequence(call_id: str) -> Any:
        base = by_id.get(call_id)
        return None if base is None else np.concatenate([prompt(base), unpack_ids(base["output_ids"])])

    def prompt(call: dict[str, Any]) -> Any:
        if call["call_id"] not in done:
            done[call["call_id"]] = reconstruct_prompt(call["prompt"], sequence)
        return done[call["call_id"]]

    return [prompt(c) for c in calls]


def conversation(protocol: str, body: dict[str, Any]) -> tuple[list[Any], Any]:
    """(messages, tools) the gateway makes of a recorded request body of ``protocol``."""
    from producers.gateway.body import validate

    if protocol == "anthropic.messages":
        from producers.gateway.anthropic_adapter import conversation as anthropic_conversation
        from producers.gateway.models_anthropic import MessagesRequest

        return anthropic_conversation(validate(MessagesRequest, body))
    if protocol == "openai.responses":
        from producers.gateway.models_responses import ResponsesRequest
        from producers.gateway.responses_adapter import to_internal

        internal = to_internal(validate(ResponsesRequest, body), 10**6)
    else:
        from producers.gateway.models_openai import ChatCompletionRequest
        from producers.gateway.openai_adapter import chat_to_internal

        internal = chat_to_internal(validate(ChatCompletionRequest, body), 10**6)
    return internal.messages, internal.tools


def _route(request: dict[str, Any]) -> str:
    """``POST /v1/chat/completions``: the request's method and path without the rollout prefix."""
    path = request.get("path", "")
    return f"{request.get('method', '')} {path[path.find('/v1/'):] if '/v1/' in path else path}"


def _summary(text: Any, calls: list[dict[str, Any]], script: list[str]) -> dict[str, Any]:
    from producers.parsing import parse_output
    from schemas.tokens import unpack_ids
    from tokentrail.commands.harness_breaks import break_causes

    prompts = _prompts(calls)
    requests = [json.loads(c["request_json"]) for c in calls]
    conversations = [conversation(c["protocol"], r["body"]) for c, r in zip(calls, requests, strict=True)]
    outputs = [text.decode(unpack_ids(c["output_ids"]).tolist()) for c in calls]
    exact, spliced, causes, gateway_breaks = 0, 0, [], []
    for i, (call, prompt) in enumerate(zip(calls, prompts, strict=True)):
        messages, tools = conversations[i]
        # Token-exact: the prompt decodes to a fresh render of the recorded request, and where nothing was
        # spliced in (sampled ids kept), it is that render's tokenization id for id.
        exact += (call["status"] == "OK" and text.renderer.decode(prompt.tolist()) == text.render_text(messages, tools)
                  and (call["spliced_outputs"] > 0 or prompt.tolist() == text.renderer.render(messages, tools)))
        if i:
            before = np.concatenate([prompts[i - 1], unpack_ids(calls[i - 1]["output_ids"])])
            extends = bool(len(before) <= len(prompt) and np.array_equal(before, prompt[:len(before)]))
            spliced += extends
            if not extends:
                named = break_causes(conversations[i - 1][0], parse_output(outputs[i - 1]), messages)
                causes += [f"call {i}: {cause}" for cause in named]
                if not named:
                    causes += [f"call {i}: other ({b[:160]})" for b in call["prefix_breaks"]] or [f"call {i}: other"]
        gateway_breaks += list(call["prefix_breaks"])
    # What the harness received is the scripted completion (parsed into its protocol's tool calls or text).
    outputs_match = sum(out == script[c["call_index"]] for c, out in zip(calls, outputs, strict=True)
                        if c["call_index"] < len(script))
    return {"calls": len(calls), "protocols": sorted({c["protocol"] for c in calls}),
            "routes": sorted({_route(r) for r in requests}), "token_exact_calls": exact,
            "outputs_as_received": outputs_match, "spliced_calls": spliced, "pairs": max(0, len(calls) - 1),
            "break_causes": causes, "prefix_breaks": sorted(set(gateway_breaks))}


def _rollout_status(env: list[tuple[str, dict[str, Any]]], calls: list[dict[str, Any]], rollout_id: str) -> str:
    """COMPLETE / INCOMPLETE as the processors' own assembler makes of the attempt's records ('' if none)."""
    from processors.assembler import RolloutAssembly

    state = RolloutAssembly(rollout_id)
    emitted = [r for name, rec in [*env, *(("CallRecord", c) for c in calls)] for r in state.accept(name, rec).rollouts]
    return str(emitted[-1]["status"]) if emitted else ""


def check_harness(harness: Harness, url: str, model: str, text: Any, settings: Settings, topics: dict[str, str],
                  timeout_s: float) -> dict[str, Any]:
    """Run one harness through the gateway at ``url`` and judge its calls from the calls topic."""
    started = time.monotonic()
    rollout_id, finished, failure = _run(harness, url, model, timeout_s)
    calls = [r for _, r in _records(settings, topics["calls_topic"], rollout_id, int(finished["call_count"]),
                                    "CallRecord")]
    calls.sort(key=lambda r: r["call_index"])
    env = _records(settings, topics["env_topic"], rollout_id, 2)
    row = {"rollout_id": rollout_id, **_summary(text, calls, harness.script),
           "rollout": _rollout_status(env, calls, rollout_id), "seconds": round(time.monotonic() - started, 1)}
    problems = [failure] if failure else []
    if row["calls"] < 3 or row["calls"] != finished["call_count"]:
        problems.append(f"{row['calls']} calls on the topic, {finished['call_count']} counted at the finish")
    if row["token_exact_calls"] != row["calls"]:
        problems.append("calls not token-exact")
    if row["outputs_as_received"] != row["calls"]:
        problems.append("outputs do not decode to what the harness received")
    if row["rollout"] != "COMPLETE":
        problems.append(f"rollout {row['rollout'] or 'not assembled'}")
    return {**row, "passed": not problems, "reason": "; ".join(problems)}


def _cmd_check(args: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from producers.gateway.text_side import ModelTextSide
    from schemas.topics import CALLS_TOPIC, ENV_TOPIC

    settings = get_settings()
    model = settings.model.harness_name
    topics = {"calls_topic": args.calls_topic or CALLS_TOPIC, "env_topic": args.env_topic or ENV_TOPIC}
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    rows: dict[str, dict[str, Any]] = {}
    with ExitStack() as stack:
        if args.gateway:
            url, text = args.gateway.rstrip("/"), None  # loaded when a harness runs
        else:
            from models.reference.build import build_model
            from models.reference.spec import HARNESS_SPEC
            from schemas.kafka.topic_admin import ensure_gateway_topics
            from testkit.gateway import running_embedded_gateway

            model_dir = build_model(settings.model.harness_dir, spec=HARNESS_SPEC, progress=print)
            ensure_gateway_topics(settings.kafka, **topics)  # its own gateway: the topics must exist (fresh broker)
            served = settings.model_copy(update={"model": settings.model.model_copy(
                update={"spec": "harness", "dir": model_dir, "name": model})})
            spool = stack.enter_context(tempfile.TemporaryDirectory(prefix="tokentrail-check-spool-"))
            text = ModelTextSide.from_dir(model_dir)
            gw = stack.enter_context(running_embedded_gateway(served, spool_dir=spool, topics=topics, text=text,
                                                              model_aliases={"*": model}))
            url = gw.url
        for name in names:
            if name not in HARNESSES:
                rows[name] = {"passed": False, "reason": NOT_YET.get(name, "unknown harness")}
                continue
            print(f"{name}: running {HARNESSES[name].protocol} through {url} ...", flush=True)
            text = text or ModelTextSide.from_dir(settings.model.harness_dir)
            rows[name] = check_harness(HARNESSES[name], url, model, text, settings, topics, args.timeout_s)
            print(f"{name}: {'passed' if rows[name]['passed'] else 'FAILED ' + rows[name]['reason']} "
                  f"({rows[name]['seconds']} s)", flush=True)
    for name in NOT_YET:
        rows.setdefault(name, {"passed": False, "reason": NOT_YET[name]})
    _print_table(rows)
    calls = sum(r.get("calls", 0) for r in rows.values())
    pairs = sum(r.get("pairs", 0) for r in rows.values())
    print(json.dumps({"harnesses": list(rows), "harnesses_passed": [n for n, r in rows.items() if r["passed"]],
                      "calls": calls, "token_exact_calls": sum(r.get("token_exact_calls", 0) for r in rows.values()),
                      "spliced_fraction": round(sum(r.get("spliced_calls", 0) for r in rows.values()) / pairs, 3)
                      if pairs else 0.0, "per_harness": rows}))
    return 0 if all(rows[n]["passed"] for n in names) else 1


def _print_table(rows: dict[str, dict[str, Any]]) -> None:
    print(f"{'harness':<8} {'passed':<6} {'calls':>5} {'exact':>5} {'spliced':>7} {'rollout':<8}  "
          "protocols, routes / reason")
    for name, r in rows.items():
        spliced = f"{r.get('spliced_calls', 0)}/{r.get('pairs', 0)}" if "calls" in r else "-"
        detail = "; ".join(filter(None, [", ".join([*r.get("protocols", []), *r.get("routes", [])]),
                                         r.get("reason", "")]))
        print(f"{name:<8} {'yes' if r['passed'] else 'no':<6} {r.get('calls', '-'):>5} "
              f"{r.get('token_exact_calls', '-'):>5} {spliced:>7} {r.get('rollout', '-'):<8}  {detail}")
        for cause in r.get("break_causes", []):  # why a call's prompt did not extend the previous one
            print(f"{'':<8} prefix break, {cause}")
