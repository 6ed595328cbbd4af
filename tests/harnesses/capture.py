"""Run each installed harness headless against the capture server and keep what it sent.

``python -m tests.harnesses.capture [RUN ...] [--scenario hi|tool|refuse|no-model] [--strace] [--isolate]``
runs each named run (default: all: Claude Code, Codex on a custom model and on its default model, Pi, and
OpenClaw on each of its API adapters and through ``agent --local``) once, in a throwaway HOME and working
directory, with only the base URL pointing at a capture server on 127.0.0.1, and writes

- ``tests/harnesses/captured/<run>[-<scenario>].jsonl``: every request (key values redacted) and its reply,
- ``tests/harnesses/captured/<run>[-<scenario>].out.txt``: the command, a summary line (exit status, calls,
  ``outside_traffic``), stdout/stderr tails; with ``--strace``, ``outside_traffic`` lists every
  connect/send of the process tree to an address other than loopback, DNS queries with the name asked for
  (there must be none: nothing may leave the machine).

Scenarios: "hi" (prompt "say hi", every call answered "hi"); "tool" (one call of the harness's own shell
tool, then an answer; reasoning parts where asked); "refuse" (400 for output caps over 4096, as the gateway
used to); "no-model" (404 for the first model name). ``--isolate`` re-runs the whole thing in a new network
namespace with only loopback up. tests/harnesses/captured/README.md summarises the captures.

The per-harness setup below (config files, environment) is the one the harness tests use too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.harnesses.capture_server import CaptureServer, Refusal, Reply, ToolCall, has_tool_results
from tests.harnesses.harnesses import (
    CODEX_QUIET_TOML,
    HARNESSES,
    OPENCLAW_QUIET_CONFIG,
    SETUP_HINT,
    Harness,
)

CAPTURED = Path(__file__).resolve().parent / "captured"
API_KEY = "capture-key-not-secret"
MODEL = "capture-model"
DEFAULT_PROMPT = "say hi"
# The "tool" scenario: the first call that offers the harness's shell tool is answered with a call of it
# running SHELL_COMMAND; every call carrying a tool result is answered TOOL_DONE; any other call "hi".
TOOL_PROMPT = "Create hi.txt containing hello with a shell command, show it, then answer done."
SHELL_COMMAND = "echo hello > hi.txt && cat hi.txt"
TOOL_DONE = "done: hi.txt says hello"
# ... and, where the request asks for reasoning, every reply of the "tool" scenario starts with a
# reasoning part (an Anthropic thinking block with a signature, a Responses reasoning item with
# encrypted_content), to see how each harness sends it back.
TOOL_REASONING = "Plan: write hi.txt with the shell tool, then report."
# The "refuse" scenario answers every call that asks for more than REFUSE_ABOVE output tokens as the
# gateway used to (400); "no-model" answers every call for the first model name seen 404, as for a model
# the server does not have. Both show how a harness retries or falls back.
OUTPUT_CAPS = ("max_tokens", "max_output_tokens", "max_completion_tokens")
REFUSE_ABOVE = 4096
REFUSE_MESSAGE = "max_tokens is {cap}, above this gateway's limit of 4096"


def offered_tools(body: dict[str, object]) -> set[str]:
    """The names of the tools a request offers: ``tools`` (chat ``function.name`` too), tools nested in a
    ``namespace``, and Codex's ``additional_tools`` input items."""
    names: set[str] = set()

    def walk(tools: object) -> None:
        for tool in tools if isinstance(tools, list) else []:
            if isinstance(tool, dict):
                name = tool.get("name") or (tool.get("function") or {}).get("name")
                if name:
                    names.add(name)
                walk(tool.get("tools"))

    walk(body.get("tools"))
    for item in body.get("input") if isinstance(body.get("input"), list) else []:
        if isinstance(item, dict) and item.get("type") == "additional_tools":
            walk(item.get("tools"))
    return names


Build = Callable[[str, Path, Path, str, bool], tuple[list[str], dict[str, str]]]


@dataclass
class Run:
    """One harness invocation: ``build(base_url, home, work, prompt, tools)`` gives the command and
    environment (``tools``: the run lets the model's shell tool call execute); ``shell`` is the call of
    the harness's own shell tool that the "tool" scenario answers with."""

    name: str
    harness: Harness
    build: Build
    shell: ToolCall

    def reply_for(self, scenario: str) -> Callable[[dict[str, object]], Reply] | None:
        if scenario == "hi":
            return None
        if scenario in ("refuse", "no-model"):
            first_model: list[object] = []

            def refuse(record: dict[str, object]) -> Reply:
                body = record.get("body")
                if not isinstance(body, dict):
                    return "hi"
                if scenario == "refuse":
                    cap = max(int(body.get(k) or 0) for k in OUTPUT_CAPS)
                    return Refusal(400, REFUSE_MESSAGE.format(cap=cap)) if cap > REFUSE_ABOVE else "hi"
                first_model[:] = first_model or [body.get("model")]
                return (Refusal(404, f"model: {body.get('model')}", "not_found_error")
                        if body.get("model") == first_model[0] else "hi")
            return refuse

        def reply(record: dict[str, object]) -> Reply:
            body = record.get("body")
            if not isinstance(body, dict):
                return "hi"
            if has_tool_results(body):
                return TOOL_DONE
            return self.shell if self.shell.name in offered_tools(body) else "hi"
        return reply


def _claude(base_url: str, home: Path, work: Path, prompt: str, tools: bool) -> tuple[list[str], dict[str, str]]:
    h = HARNESSES["claude"]
    env = h.env(home, {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_AUTH_TOKEN": API_KEY})
    cmd = [str(h.binary), "-p", prompt, "--output-format", "json", "--max-turns", "4" if tools else "2"]
    return cmd + (["--allowedTools", "Bash"] if tools else []), env


def _codex(model: str | None) -> Build:
    """Codex on a custom Responses provider; ``model`` None leaves Codex's own default model (a slug in
    its bundled catalog, so it sends that model's full tool set and reasoning options)."""
    def build(base_url: str, home: Path, work: Path, prompt: str, tools: bool) -> tuple[list[str], dict[str, str]]:
        return _codex_cmd(model, base_url, home, work, prompt, tools)
    return build


def _codex_cmd(model: str | None, base_url: str, home: Path, work: Path, prompt: str,
               tools: bool) -> tuple[list[str], dict[str, str]]:
    h = HARNESSES["codex"]
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        (f'model = "{model}"\n' if model else "")
        + 'model_provider = "capture"\n'
        + CODEX_QUIET_TOML
        + "\n[model_providers.capture]\n"
        'name = "capture"\n'
        f'base_url = "{base_url}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "CAPTURE_API_KEY"\n')
    env = h.env(home, {"CODEX_HOME": str(codex_home), "CAPTURE_API_KEY": API_KEY})
    sandbox = ["--sandbox", "workspace-write"] if tools else []
    return [str(h.binary), "exec", "--skip-git-repo-check", *sandbox, prompt], env


def _pi(base_url: str, home: Path, work: Path, prompt: str, tools: bool) -> tuple[list[str], dict[str, str]]:
    h = HARNESSES["pi"]
    agent_dir = home / ".pi" / "agent"
    agent_dir.mkdir(parents=True, exist_ok=True)
    # Pi's minimal entry for a local OpenAI-compatible server (only the model id), as its docs show.
    (agent_dir / "models.json").write_text(json.dumps({"providers": {"capture": {
        "baseUrl": f"{base_url}/v1", "api": "openai-completions", "apiKey": API_KEY,
        "compat": {"supportsDeveloperRole": False}, "models": [{"id": MODEL}]}}}, indent=2))
    env = h.env(home)
    return [str(h.binary), "-p", prompt, "--model", f"capture/{MODEL}"], env


def _openclaw(api: str, local: bool = False) -> Build:
    """OpenClaw's headless ``agent exec`` (or, ``local``, ``agent --local``) on a provider with ``api``."""
    def build(base_url: str, home: Path, work: Path, prompt: str, tools: bool) -> tuple[list[str], dict[str, str]]:
        h = HARNESSES["openclaw"]
        state = home / ".openclaw"
        state.mkdir(parents=True, exist_ok=True)
        url = base_url if api == "anthropic-messages" else f"{base_url}/v1"
        config = {
            **OPENCLAW_QUIET_CONFIG,
            "models": {"mode": "replace", "providers": {"capture": {
                "baseUrl": url, "api": api, "apiKey": API_KEY,
                "models": [{"id": MODEL, "name": MODEL, "input": ["text"]}]}}},
            "agents": {"defaults": {"model": {"primary": f"capture/{MODEL}"}, "workspace": str(work)}},
        }
        (state / "openclaw.json").write_text(json.dumps(config, indent=2))
        env = h.env(home, {"OPENCLAW_STATE_DIR": str(state), "OPENCLAW_CONFIG_PATH": str(state / "openclaw.json")})
        if local:
            return [str(h.binary), "agent", "--local", "--agent", "main", "--json", "--message", prompt], env
        return [str(h.binary), "agent", "exec", "--config", str(state / "openclaw.json"), "--json",
                "--cwd", str(work), "--model", f"capture/{MODEL}", prompt], env
    return build


_OPENCLAW_EXEC = ToolCall("exec", {"command": SHELL_COMMAND})
RUNS: dict[str, Run] = {
    "claude": Run("claude", HARNESSES["claude"], _claude,
                  ToolCall("Bash", {"command": SHELL_COMMAND, "description": "Write and show hi.txt"})),
    "codex": Run("codex", HARNESSES["codex"], _codex(MODEL), ToolCall("exec_command", {"cmd": SHELL_COMMAND})),
    # Codex's default model runs in code mode: one freeform `exec` tool taking JavaScript that calls the
    # nested tools (tools.exec_command, ...), offered in an `additional_tools` input item.
    "codex-default-model": Run("codex-default-model", HARNESSES["codex"], _codex(None), ToolCall(
        "exec", f"const r = await tools.exec_command({{cmd: {json.dumps(SHELL_COMMAND)}}});\ntext(r);\n",
        custom=True)),
    "pi": Run("pi", HARNESSES["pi"], _pi, ToolCall("bash", {"command": SHELL_COMMAND})),
    "openclaw": Run("openclaw", HARNESSES["openclaw"], _openclaw("openai-completions"), _OPENCLAW_EXEC),
    "openclaw-responses": Run("openclaw-responses", HARNESSES["openclaw"], _openclaw("openai-responses"),
                              _OPENCLAW_EXEC),
    "openclaw-anthropic": Run("openclaw-anthropic", HARNESSES["openclaw"], _openclaw("anthropic-messages"),
                              _OPENCLAW_EXEC),
    "openclaw-local": Run("openclaw-local", HARNESSES["openclaw"], _openclaw("openai-completions", local=True),
                          _OPENCLAW_EXEC),
}

STRACE = ["strace", "-f", "-qq", "-s", "256", "-e", "trace=connect,sendto,sendmsg,sendmmsg"]
_SYSCALL = re.compile(r"^\d+\s+(connect|sendto|sendmsg|sendmmsg)\(")
_ADDR = re.compile(r'sin6?_port=htons\((\d+)\), (?:sin_addr=inet_addr\("([^"]+)"\)|'
                   r'sin6_flowinfo=[^,]*, inet_pton\(AF_INET6, "([^"]+)"\))')
_IOV = re.compile(r'iov_base="((?:[^"\\]|\\.)*)"|sendto\(\d+, "((?:[^"\\]|\\.)*)"')


def _dns_name(escaped: str) -> str | None:
    """The query name of a DNS packet, given as strace prints it (C escapes)."""
    data = escaped.encode("latin-1").decode("unicode_escape").encode("latin-1")
    labels, i = [], 12
    while 12 <= i < len(data) and data[i]:
        n = data[i]
        labels.append(data[i + 1 : i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    return ".".join(labels) or None


def outside_traffic(trace: str) -> list[str]:
    """Each connect/send in an strace log to an address that is not loopback (DNS queries name their host).

    The resolver is asked only for names that are not IP literals, so a DNS query to the name server is
    the first sign of a harness reaching for a host other than the base URL's 127.0.0.1."""
    seen = []
    for line in trace.splitlines():
        if not _SYSCALL.search(line):
            continue
        m = _ADDR.search(line)
        if m:
            addr = m.group(2) or m.group(3) or ""
            if addr.startswith("127.") or addr in ("::1", "::ffff:127.0.0.1"):
                continue
            port = m.group(1)
        elif "sendmmsg" in line or "sendmsg" in line:
            port, addr = "?", "(connected socket)"
        else:
            continue
        names = {_dns_name(a or b) for a, b in _IOV.findall(line)} - {None}
        what = f"DNS query for {', '.join(sorted(names))}" if names else line.strip()[:160]
        seen.append(f"{addr}:{port}  {what}")
    return sorted(set(seen))


def capture(run: Run, scenario: str = "hi", out_dir: Path = CAPTURED, use_strace: bool = False,
            timeout: float = 300, keep: bool = False) -> dict[str, object]:
    """Run one harness against a fresh capture server; write ``<run>[-<scenario>].jsonl`` and ``.out.txt``.

    Scenario "hi": the prompt "say hi", every call answered "hi". Scenario "tool": TOOL_PROMPT, the
    harness's shell tool called once with SHELL_COMMAND, then TOOL_DONE; the summary says what hi.txt
    holds (it must be "hello"). "refuse" / "no-model": see REFUSE_ABOVE. Returns the summary."""
    if not run.harness.installed():
        raise SystemExit(f"{run.harness.binary} is missing: {SETUP_HINT}")
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = run.name if scenario == "hi" else f"{run.name}-{scenario}"
    prompt = TOOL_PROMPT if scenario == "tool" else DEFAULT_PROMPT
    jsonl = out_dir / f"{stem}.jsonl"
    jsonl.unlink(missing_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"harness-{run.name}-"))
    home, work = tmp / "home", tmp / "work"
    home.mkdir()
    work.mkdir()
    try:
        with CaptureServer(jsonl, reply_for=run.reply_for(scenario),
                           reasoning=TOOL_REASONING if scenario == "tool" else None) as server:
            cmd, env = run.build(server.base_url, home, work, prompt, scenario == "tool")
            trace_file = tmp / "strace.txt"
            full = ([*STRACE, "-o", str(trace_file)] if use_strace else []) + cmd
            t0 = time.monotonic()
            proc = subprocess.run(full, cwd=work, env=env, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
            elapsed = time.monotonic() - t0
            time.sleep(0.2)
            n = len(server.records)
        connects = outside_traffic(trace_file.read_text()) if use_strace else None
        summary: dict[str, object] = {"run": stem, "rc": proc.returncode, "seconds": round(elapsed, 1),
                                      "requests": n, "outside_traffic": connects}
        if scenario == "tool":
            made = work / "hi.txt"
            summary["hi.txt"] = made.read_text().strip() if made.exists() else None
        text = [f"$ {' '.join(cmd)}", json.dumps(summary), "", "--- stdout (tail)", proc.stdout[-6000:],
                "--- stderr (tail)", proc.stderr[-6000:]]
        if connects:
            text += ["--- traffic not to loopback", *connects]
        (out_dir / f"{stem}.out.txt").write_text("\n".join(text) + "\n")
        return summary
    finally:
        if keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("runs", nargs="*", help=f"which runs (default: all): {', '.join(RUNS)}")
    parser.add_argument("--scenario", choices=["hi", "tool", "refuse", "no-model"], default="hi",
                        help="hi: 'say hi'; tool: one scripted shell tool call, then an answer; refuse: 400 for "
                             "output caps over 4096; no-model: 404 for the first model name")
    parser.add_argument("--out-dir", type=Path, default=CAPTURED)
    parser.add_argument("--strace", action="store_true", help="trace connect/send calls; report any not to loopback")
    parser.add_argument("--keep", action="store_true", help="keep the throwaway HOME and working dir")
    parser.add_argument("--isolate", action="store_true",
                        help="run in a new network namespace with only loopback up (needs root or user namespaces)"
                             ": nothing can leave the machine even if a harness tries")
    parser.add_argument("--drop-env", action="append", default=[], metavar="VAR",
                        help="leave this quieting variable unset (exploration; use with --isolate)")
    args = parser.parse_args(argv)
    if args.isolate and not os.environ.get("_HARNESS_CAPTURE_ISOLATED"):
        rest = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--isolate"]
        inner = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "tests.harnesses.capture", *rest])
        os.environ["_HARNESS_CAPTURE_ISOLATED"] = "1"
        os.execvp("unshare", ["unshare", "-n", "sh", "-c", f"ip link set lo up && exec {inner}"])
    for var in args.drop_env:
        for harness in HARNESSES.values():
            harness.quiet.pop(var, None)  # type: ignore[attr-defined]
    unknown = sorted(set(args.runs) - set(RUNS))
    if unknown:
        parser.error(f"unknown runs {unknown}; choose from {list(RUNS)}")
    for name in args.runs or list(RUNS):
        print(json.dumps(capture(RUNS[name], args.scenario, args.out_dir, args.strace, keep=args.keep)), flush=True)


if __name__ == "__main__":
    main()
