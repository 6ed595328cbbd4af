"""Typed errors of the stage core. Adapters turn them into dead-letter records with the reason."""

from __future__ import annotations


class ProcessorError(ValueError):
    """Base of every error the stage core raises on bad input."""


class InvalidEvent(ProcessorError):
    """An input event is malformed or contradicts what is already known about its attempt."""


class ConflictingEvent(InvalidEvent):
    """Two different events claim the same slot (same call index or env event index)."""


class RolloutTooLarge(InvalidEvent):
    """An event would grow its rollout's open state past the byte cap (``max_rollout_bytes``): kept out of
    the state (dead-lettered), so the state and its emitted rollout always fit a Kafka record."""


class CallTokensError(ProcessorError):
    """A call's prompt cannot be rebuilt exactly (delta base missing or hash mismatch)."""

    def __init__(self, call_id: str, call_index: int, reason: str) -> None:
        self.call_id, self.call_index, self.reason = call_id, call_index, reason
        super().__init__(f"call {call_index} ({call_id}): {reason}")


class ConfigError(ProcessorError):
    """A reward, credit, sample or grouping configuration is invalid."""


class PipelineInputError(ProcessorError):
    """process_group / rederive received inputs that do not belong together."""
