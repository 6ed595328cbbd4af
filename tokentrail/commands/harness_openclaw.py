"""OpenClaw 2026.9.6 in ``tokentrail harnesses check``: one isolated, headless, embedded agent turn
(``openclaw agent exec``) against the rollout's gateway root over OpenAI chat completions.

Why chat completions (of OpenClaw's three provider APIs, all captured in tests/harnesses/captured): it is the
gateway's most exercised path (Pi runs on it) and OpenClaw's chat requests are plain (a system string, user
turns, function tools, ``tool_choice: "auto"``, ``max_completion_tokens`` 8192, Bearer key). Anthropic
Messages would work as well but OpenClaw sends the key as ``x-api-key``, two consecutive user turns and
``cache_control`` marks, and has the same prefix break (its internal-context message moves to the end);
Responses keeps call 1's input a prefix of call 2's, but that adapter is being extended for Codex.

Why ``agent exec`` rather than ``agent --local``: both run the agent embedded (no OpenClaw gateway daemon),
but ``exec`` is one isolated turn with an explicit ``--config`` and ``--cwd`` and skips the workspace bootstrap
files (AGENTS.md …) that ``--local`` creates and injects: its prompt is 36.6 K characters instead of 61 K,
which the CPU engine prefills three times per run.
"""

from __future__ import annotations

import json
from pathlib import Path

PROVIDER = "gateway"
# Shell-side switches beside env.sh's: CI=1 is what OpenClaw documents as "sends nothing" (no daily update
# check or statistics); the config below turns the update check and telemetry off as well.
QUIET_ENV = {"CI": "1"}
QUIET_CONFIG = {"update": {"checkOnStart": False}, "telemetry": {"enabled": False}}


def openclaw_config(root: str, key: str, work: Path, model: str) -> dict[str, object]:
    """An ``openclaw.json`` with one provider, the gateway (OpenAI chat completions at ``root``/v1), whose only
    model is ``model``; the default agent's workspace is ``work``."""
    return {
        **QUIET_CONFIG,
        "models": {"mode": "replace", "providers": {PROVIDER: {
            "baseUrl": f"{root}/v1", "api": "openai-completions", "apiKey": key,
            "models": [{"id": model, "name": model, "input": ["text"]}]}}},
        "agents": {"defaults": {"model": {"primary": f"{PROVIDER}/{model}"}, "workspace": str(work)}},
    }


def openclaw_command(root: str, key: str, home: Path, work: Path, model: str, task: str
                     ) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) of one ``openclaw agent exec`` turn doing ``task`` in ``work``, its state and
    config under ``home``. ``openclaw`` is deploy/harnesses/bin/openclaw (env.sh puts it first on PATH), which
    runs it on Node 24."""
    state = home / ".openclaw"
    state.mkdir(parents=True, exist_ok=True)
    config = state / "openclaw.json"
    config.write_text(json.dumps(openclaw_config(root, key, work, model), indent=2))
    env = {**QUIET_ENV, "OPENCLAW_STATE_DIR": str(state), "OPENCLAW_CONFIG_PATH": str(config)}
    return ["openclaw", "agent", "exec", "--config", str(config), "--json", "--cwd", str(work),
            "--model", f"{PROVIDER}/{model}", task], env
