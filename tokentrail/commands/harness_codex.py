"""Codex CLI 0.169.0 in ``tokentrail harnesses check``: one headless ``codex exec`` turn against the rollout's
gateway root over the OpenAI Responses API (the only API Codex speaks), through a custom provider.

The provider is what a user writes to point Codex at any Responses server: ``base_url`` (the rollout's root +
``/v1``), ``wire_api = "responses"`` and ``env_key`` (the rollout's key). ``model`` is the served model's
name: Codex does not know it ("Defaulting to fallback metadata"), so it sends its plain tool set (function
tools, one ``namespace`` of multi-agent tools, a hosted ``web_search``) rather than a catalog model's
freeform ``exec``. ``CODEX_HOME`` is a throwaway directory with the switches that keep Codex from calling
anything but the base URL (no update check, analytics, feedback, plugin sync or OpenTelemetry export).
``--sandbox workspace-write`` lets its shell tool write in the working directory without asking.
"""

from __future__ import annotations

from pathlib import Path

PROVIDER = "tokentrail"
KEY_VAR = "TOKENTRAIL_API_KEY"
# Telemetry, update checks, plugin sync and OpenTelemetry export off (tests/harnesses uses the same).
QUIET_TOML = """\
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[features]
# The curated-plugin sync at startup fetches github.com/openai/plugins (git, then api.github.com) and
# chatgpt.com; plugins off stops it. It changes nothing in the model requests (checked on 0.169.0).
plugins = false
remote_plugin = false

[otel]
exporter = "none"
trace_exporter = "none"
metrics_exporter = "none"
"""


def codex_config(root: str, model: str) -> str:
    """``config.toml``: the gateway as the only provider, serving ``model``, and the quiet switches."""
    return (f'model = "{model}"\nmodel_provider = "{PROVIDER}"\n' + QUIET_TOML
            + f'\n[model_providers.{PROVIDER}]\nname = "{PROVIDER}"\nbase_url = "{root}/v1"\n'
            f'wire_api = "responses"\nenv_key = "{KEY_VAR}"\n')


def codex_command(root: str, key: str, home: Path, work: Path, model: str, task: str, codex: str = "codex"
                  ) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) of one ``codex exec`` turn doing ``task`` in the current directory (``work``),
    its config and state in ``home``/.codex. ``codex`` is deploy/harnesses/node_modules/.bin/codex (env.sh puts
    it on PATH) unless a path is given."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(root, model))
    # codex exec appends whatever its stdin holds to the prompt when stdin is not a terminal, and waits for its
    # end: an inherited open pipe would hang it, so stdin is /dev/null.
    argv = ["sh", "-c", 'exec "$0" "$@" </dev/null', codex, "exec", "--skip-git-repo-check",
            "--sandbox", "workspace-write", task]
    return argv, {"CODEX_HOME": str(codex_home), KEY_VAR: key}
