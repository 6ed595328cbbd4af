"""The agent harnesses of deploy/harnesses are installed (``make setup-harnesses``) and run from there.

Not skipped when they are missing: CI runs ``make setup-harnesses`` before the tests, so a missing or
broken install is a failure that says what to run.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.harnesses.harnesses import (
    CLAUDE_QUIET,
    CODEX_QUIET,
    COMMON_QUIET,
    HARNESS_DIR,
    HARNESSES,
    NODE24_BIN,
    OPENCLAW_QUIET,
    PI_QUIET,
    SETUP_HINT,
)

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_harness_runs_from_its_installed_location(name: str, tmp_path: Path) -> None:
    harness = HARNESSES[name]
    assert harness.binary.exists(), f"{name} is not installed at {harness.binary}: {SETUP_HINT}"
    home = tmp_path / "home"
    home.mkdir()
    proc = subprocess.run([str(harness.binary), *harness.version_args], env=harness.env(home), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{name} {' '.join(harness.version_args)} failed ({proc.returncode}): " \
                                 f"{proc.stderr[-2000:]}\n{SETUP_HINT}"
    assert harness.version_text in proc.stdout + proc.stderr, (name, proc.stdout[-500:], proc.stderr[-500:])


def test_openclaw_runs_on_the_node_24_from_npm(tmp_path: Path) -> None:
    node = NODE24_BIN / "node"
    assert node.exists(), f"Node 24 is not installed at {node}: {SETUP_HINT}"
    version = subprocess.run([str(node), "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    major, minor = (int(x) for x in version.lstrip("v").split(".")[:2])
    assert (major, minor) >= (24, 16), f"OpenClaw 2026.9.6 needs Node >= 24.16, node24/ has {version}"
    env = HARNESSES["openclaw"].env(tmp_path)
    found = subprocess.run(["node", "--version"], env=env, capture_output=True, text=True, timeout=60).stdout.strip()
    assert found == version, "the OpenClaw environment must put Node 24 first on PATH"


def test_the_shell_wrapper_runs_openclaw(tmp_path: Path) -> None:
    proc = subprocess.run([str(HARNESS_DIR / "bin" / "openclaw"), "--version"], env=HARNESSES["openclaw"].env(tmp_path),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{proc.stderr[-2000:]}\n{SETUP_HINT}"
    assert HARNESSES["openclaw"].version_text in proc.stdout


def test_installed_versions_are_the_pinned_ones() -> None:
    """node_modules holds exactly what the lockfiles pin (npm ci, not a stale or hand-made install)."""
    for folder in (HARNESS_DIR, HARNESS_DIR / "node24", HARNESS_DIR / "openclaw"):
        pinned = json.loads((folder / "package.json").read_text())
        wanted = {**pinned.get("dependencies", {}), **pinned.get("optionalDependencies", {})}
        installed = {}
        for dep in wanted:
            manifest = folder / "node_modules" / dep / "package.json"
            if manifest.exists():
                installed[dep] = json.loads(manifest.read_text())["version"]
        required = set(pinned.get("dependencies", {}))
        assert required <= set(installed), f"{folder}: missing {sorted(required - set(installed))}: {SETUP_HINT}"
        if folder.name == "node24":
            assert installed, f"{folder}: no node-linux-* package installed for this platform: {SETUP_HINT}"
        assert all(installed[d] == wanted[d] for d in installed), (folder, installed, wanted)


def test_env_sh_sets_the_same_switches_as_the_tests() -> None:
    """deploy/harnesses/env.sh (for shells) and harnesses.py (for tests) keep the same quieting switches."""
    exported = dict(re.findall(r"\b([A-Z][A-Z0-9_]+)=(\S+)", "\n".join(
        line.split("#", 1)[0] for line in (HARNESS_DIR / "env.sh").read_text().splitlines()
        if line.startswith("export "))))
    exported.pop("PATH", None)
    exported.pop("TOKENTRAIL_HARNESSES", None)
    expected = {**{k: v for k, v in COMMON_QUIET.items() if k not in ("NO_COLOR", "FORCE_COLOR")},
                **CLAUDE_QUIET, **CODEX_QUIET, **PI_QUIET, **{k: v for k, v in OPENCLAW_QUIET.items() if k != "CI"}}
    assert exported == expected
