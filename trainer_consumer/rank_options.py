"""``TrainOptions`` as JSON: how ``tokentrail train --nproc N`` hands its parsed options to every rank that
``torchrun`` starts (``python -m trainer_consumer`` reads the file named by ``TOKENTRAIL_TRAIN_OPTIONS``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orjson

from trainer_consumer.batching import FilterConfig
from trainer_consumer.learner import LearnerConfig
from trainer_consumer.losses import LossConfig
from trainer_consumer.trainer import TrainOptions

_PATHS = ("model_dir", "checkpoint_dir")
# The environment variable naming the options file a rank reads (``python -m trainer_consumer``).
OPTIONS_ENV = "TOKENTRAIL_TRAIN_OPTIONS"


def options_to_json(options: TrainOptions) -> bytes:
    return orjson.dumps(dataclasses.asdict(options), default=str)


def options_from_json(data: bytes | str) -> TrainOptions:
    raw: dict[str, Any] = orjson.loads(data)
    if raw.get("filters") is not None:
        f = raw["filters"]
        raw["filters"] = FilterConfig(**{**f, "kinds": tuple(f["kinds"]) if f.get("kinds") is not None else None})
    if raw.get("learner") is not None:
        lc = raw["learner"]
        raw["learner"] = LearnerConfig(**{**lc, "betas": tuple(lc["betas"]), "loss": LossConfig(**lc["loss"])})
    for name in _PATHS:
        if raw.get(name) is not None:
            raw[name] = Path(raw[name])
    return TrainOptions(**raw)
