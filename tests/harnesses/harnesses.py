"""Where the real agent harnesses are installed (``make setup-harnesses``) and how to run them offline.

The layout (deploy/harnesses/README.md):

- ``deploy/harnesses/node_modules/.bin/{claude,codex,pi}``: Claude Code, Codex CLI and Pi, on the
  machine's Node (20 or newer);
- ``deploy/harnesses/node24/node_modules/.bin/node``: Node 24 from the npm registry;
- ``deploy/harnesses/openclaw/node_modules/.bin/openclaw``: OpenClaw, which needs Node >= 24.16, so it
  runs with the Node 24 directory first on ``PATH`` (``Harness.env`` does that).

``quiet_env`` holds the switches that keep each harness from calling anything but the base URL it is
given: telemetry, auto-update, error reporting, feedback and other nonessential traffic off. The same
values are in deploy/harnesses/env.sh for shells.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tokentrail.commands.harness_codex import QUIET_TOML

ROOT = Path(__file__).resolve().parents[2]
HARNESS_DIR = ROOT / "deploy" / "harnesses"
BIN = HARNESS_DIR / "node_modules" / ".bin"
NODE24_BIN = HARNESS_DIR / "node24" / "node_modules" / ".bin"
OPENCLAW_BIN = HARNESS_DIR / "openclaw" / "node_modules" / ".bin"
SETUP_HINT = "run `make setup-harnesses` (npm ci of deploy/harnesses; see deploy/harnesses/README.md)"

# Shared by every harness: the DO_NOT_TRACK convention, no update notices, no colour codes in output.
COMMON_QUIET = {"DO_NOT_TRACK": "1", "NO_UPDATE_NOTIFIER": "1", "NO_COLOR": "1", "FORCE_COLOR": "0"}

CLAUDE_QUIET = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
    "CLAUDE_CODE_ENABLE_TELEMETRY": "0",
}
# Codex has no environment switches for these; its CODEX_HOME/config.toml turns analytics, feedback,
# the update check and OpenTelemetry export off (see CODEX_QUIET_TOML).
CODEX_QUIET: dict[str, str] = {}
CODEX_QUIET_TOML = QUIET_TOML  # one copy: the check's (tokentrail/commands/harness_codex.py)
# Pi: PI_OFFLINE skips every startup network operation (version check, tool downloads).
PI_QUIET = {"PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "0"}
# OpenClaw: CI suppresses the daily update check/statistics request; its config also sets
# update.checkOnStart false and telemetry.enabled false (see OPENCLAW_QUIET_CONFIG).
OPENCLAW_QUIET = {"CI": "1", "OPENCLAW_NO_AUTO_UPDATE": "1", "OPENCLAW_OFFLINE": "1",
                  "OPENCLAW_DISABLE_BONJOUR": "1", "OPENCLAW_NO_PROMPT": "1", "OPENCLAW_NO_ONBOARD": "1"}
OPENCLAW_QUIET_CONFIG = {"update": {"checkOnStart": False}, "telemetry": {"enabled": False}}


@dataclass(frozen=True)
class Harness:
    name: str
    binary: Path
    version_args: tuple[str, ...]
    version_text: str  # what ``binary *version_args`` prints (a substring)
    quiet: Mapping[str, str] = field(default_factory=dict)
    path_first: tuple[Path, ...] = ()  # directories put first on PATH (OpenClaw: Node 24)

    def installed(self) -> bool:
        return self.binary.exists() and all(p.is_dir() for p in self.path_first)

    def env(self, home: Path, extra: Mapping[str, str] | None = None,
            base: Mapping[str, str] | None = None) -> dict[str, str]:
        """An environment for one run: ``home`` as HOME (and XDG dirs under it), the quieting switches,
        PATH with this harness's directories first, and ``extra`` last."""
        env = dict(os.environ if base is None else base)
        for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            env.pop(var, None)
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        env["HOME"] = str(home)
        env["XDG_CONFIG_HOME"] = str(home / ".config")
        env["XDG_CACHE_HOME"] = str(home / ".cache")
        env["XDG_DATA_HOME"] = str(home / ".local" / "share")
        env["XDG_STATE_HOME"] = str(home / ".local" / "state")
        env.update(COMMON_QUIET)
        env.update(self.quiet)
        env["PATH"] = os.pathsep.join([*(str(p) for p in self.path_first), str(self.binary.parent),
                                       env.get("PATH", "")])
        env.update(extra or {})
        return env


HARNESSES: dict[str, Harness] = {
    "claude": Harness("claude", BIN / "claude", ("--version",), "2.1.328 (Claude Code)", CLAUDE_QUIET),
    "codex": Harness("codex", BIN / "codex", ("--version",), "codex-cli 0.169.0", CODEX_QUIET),
    "pi": Harness("pi", BIN / "pi", ("--version",), "0.73.1", PI_QUIET),
    "openclaw": Harness("openclaw", OPENCLAW_BIN / "openclaw", ("--version",), "OpenClaw 2026.9.6",
                        OPENCLAW_QUIET, path_first=(NODE24_BIN,)),
}
