# Source this (bash or zsh) to run the installed agent harnesses by name, offline:
#   . deploy/harnesses/env.sh && claude --version && codex --version && pi --version && openclaw --version
# Install them first with `make setup-harnesses`. It puts claude, codex and pi (machine's Node, 20+)
# and bin/openclaw (a wrapper that runs OpenClaw on the Node 24 of node24/) first on PATH, and sets the
# switches that keep the harnesses from calling anything but the base URL you give them. The same
# values are in tests/harnesses/harnesses.py (tests/harnesses/test_installed.py checks they agree).
#
# Not covered by environment variables, so set them in the harness's own config:
#   Codex:    CODEX_HOME/config.toml: check_for_update_on_startup = false, [analytics] enabled = false,
#             [feedback] enabled = false, [features] plugins = false, remote_plugin = false,
#             [otel] exporter/trace_exporter/metrics_exporter = "none"
#             (without plugins = false it fetches github.com, api.github.com and chatgpt.com at startup)
#   OpenClaw: openclaw.json: "update": {"checkOnStart": false}, "telemetry": {"enabled": false}
#             (tests also set CI=1, which OpenClaw documents as "sends nothing")

if [ -n "${BASH_SOURCE:-}" ]; then
    TOKENTRAIL_HARNESSES="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
else
    TOKENTRAIL_HARNESSES="$(cd "$(dirname "$0")" && pwd)"  # zsh sets $0 to the sourced file
fi
export TOKENTRAIL_HARNESSES
export PATH="$TOKENTRAIL_HARNESSES/bin:$TOKENTRAIL_HARNESSES/node_modules/.bin:$PATH"

# every harness
export DO_NOT_TRACK=1 NO_UPDATE_NOTIFIER=1
# Claude Code
export DISABLE_TELEMETRY=1 DISABLE_AUTOUPDATER=1 DISABLE_ERROR_REPORTING=1 DISABLE_BUG_COMMAND=1
export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY=1
export CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL=1 CLAUDE_CODE_ENABLE_TELEMETRY=0
# Pi
export PI_OFFLINE=1 PI_SKIP_VERSION_CHECK=1 PI_TELEMETRY=0
# OpenClaw
export OPENCLAW_NO_AUTO_UPDATE=1 OPENCLAW_OFFLINE=1 OPENCLAW_DISABLE_BONJOUR=1 OPENCLAW_NO_PROMPT=1
export OPENCLAW_NO_ONBOARD=1
