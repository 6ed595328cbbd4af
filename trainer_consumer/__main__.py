"""``python -m trainer_consumer``: one rank of the trainer, as ``torchrun`` starts it.

    torchrun --nproc-per-node 2 --max-restarts 3 -m trainer_consumer
    tokentrail train --nproc 2 --max-restarts 3 ...     (the same, with every ``tokentrail train`` option)
    torchrun --nproc-per-node 2 -m tokentrail.cli train ...    (every option, by hand)

No command line here (parsing is the shell's): settings come from the ``TOKENTRAIL_*`` environment like
the shell's, and the ``TrainOptions`` from the JSON file named by ``TOKENTRAIL_TRAIN_OPTIONS`` (what
``tokentrail train --nproc`` writes); without it, the defaults: train on the samples topic until stopped.
Only rank 0 prints progress (the other ranks print a line when they start and stop).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from trainer_consumer.rank_options import OPTIONS_ENV, options_from_json
from trainer_consumer.rank_training import run_ranks_main
from trainer_consumer.settings import TrainerRunSettings
from trainer_consumer.trainer import TrainOptions


def main() -> int:
    path = os.environ.get(OPTIONS_ENV)
    options = options_from_json(Path(path).read_bytes()) if path else TrainOptions()
    return run_ranks_main(TrainerRunSettings(), options)


if __name__ == "__main__":
    sys.exit(main())
