"""Starts the trainer on N ranks of this host: ``torchrun`` (``torch.distributed.run``) running
``python -m trainer_consumer`` with the options as JSON. ``--max-restarts``: how often torchrun restarts
the whole group after a rank dies (each restart resumes from the last published policy and committed
offsets)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from trainer_consumer.rank_options import OPTIONS_ENV, options_to_json
from trainer_consumer.trainer import TrainOptions


def torchrun_command(nproc: int, max_restarts: int = 0) -> list[str]:
    if nproc < 1:
        raise ValueError("nproc must be at least 1")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}", "-m", "trainer_consumer"]


def torchrun_env(options_file: Path) -> dict[str, str]:
    """This process's environment (the TOKENTRAIL_* settings) plus the options file for the ranks."""
    return {**os.environ, OPTIONS_ENV: str(options_file)}


def launch_ranks(options: TrainOptions, nproc: int, max_restarts: int = 0) -> int:
    """Runs the ranks to the end; torchrun's exit status (non-zero when the group failed for good).
    SIGTERM/SIGINT to this process go to torchrun, which stops its ranks (a service manager stops the
    trainer like the one-process one)."""
    with tempfile.TemporaryDirectory(prefix="tokentrail-ranks-") as tmp:
        path = Path(tmp) / "options.json"
        path.write_bytes(options_to_json(options))
        proc = subprocess.Popen(torchrun_command(nproc, max_restarts), env=torchrun_env(path))

        def forward(signum: int, _frame: object) -> None:
            proc.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            return proc.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
