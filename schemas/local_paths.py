"""Where a local deployment keeps its files, for the defaults of every package's settings section.

The repository's ``deploy/`` holds the shipped configuration; everything a local run writes (Kafka
data, chDB, models, spool, policies, logs) lives under one folder, ``var/``. ``TOKENTRAIL_VAR_DIR``
moves all of it at once (a second local stack, or a test's own stack).
It sits at the bottom of the layers, so a section's defaults can point into it without importing the shell.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("TOKENTRAIL_VAR_DIR", REPO_ROOT / "var")).resolve()
DEPLOY_CONFIG_DIR = REPO_ROOT / "deploy" / "config"
