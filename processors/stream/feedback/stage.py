"""What each stateful step of the feedback join holds (the resolver and the join agent): its config, the
app, its table, the topics, the outputs and dead letters it writes, the worker's health and stats, the lock
that makes one input's effects atomic against the timers, and per-partition stream clocks."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import faust

from processors.feedback.config import FeedbackRewardConfig
from processors.stream.clock import PartitionClocks
from processors.stream.feedback.letters import FeedbackLetters
from processors.stream.health import WorkerHealth
from processors.stream.outputs import Outputs
from processors.stream.topics import StreamTopics


class FeedbackStage:
    def __init__(self, cfg: FeedbackRewardConfig, app: faust.App, table: Any, topics: StreamTopics,
                 outputs: Outputs, letters: FeedbackLetters, health: WorkerHealth, stats: Counter[str]) -> None:
        self.cfg = cfg
        self.app = app
        self.table = table
        self.topics = topics
        self.outputs = outputs
        self.letters = letters
        self.health = health
        self.stats = stats
        self.lock = asyncio.Lock()
        self.clock = PartitionClocks()
