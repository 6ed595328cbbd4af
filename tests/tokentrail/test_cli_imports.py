"""Commands that need no model do not import torch (tokentrail/cli.py's promise): settings, the broker and the
gateway's listen check start in about a second, and every test that starts such a command pays that, not torch."""

from __future__ import annotations

import subprocess
import sys

from tokentrail.settings import REPO_ROOT

CHECK = """
import sys
import tokentrail.settings
from tokentrail.cli import build_parser
for command in ("kafka", "topics", "clickhouse"):
    build_parser(command)
heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print(heavy)
"""


def test_settings_and_light_commands_do_not_import_torch() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
