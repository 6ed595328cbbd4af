"""Trainer consumer: samples topic -> torch batches -> policy-gradient steps -> policy versions.

Pure parts (no Kafka): ``sample_view`` (decoded Sample views and checks), ``batching`` (filters
with counted reasons, batch cutting), ``collate`` (padded / packed tensors), ``losses`` (PPO/GRPO
clipped surrogate, truncated IS, step-wide normalization), ``learner`` (one optimizer step).
Adapters: ``dataset`` (Kafka consumer, manual commits, IterableDataset), ``step_publisher`` (TrainerStep
and dead-letter producer), ``policy`` (policy store), ``trainer`` (the loop and ``run_training``).
The command ``tokentrail train`` is the shell's (``tokentrail/commands/train.py``).
"""
