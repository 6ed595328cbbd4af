"""Every per-key table entry is bounded, by bytes and by the number of things it holds (issue 29).

A table entry is rewritten to its changelog topic on every input for its key; one that grows without a bound
(a rollout's joined feedback, a session's rollout ids, waiting feedback) ends as a record Kafka refuses, the
worker crashes writing it, restarts from its committed offsets, meets the same input and crashes again. So
each table carries a ``StateBudget``, and an input that would take its key's entry past it is refused
before anything of it is sent or stored: it is dead-lettered with the reason (``StateOverflow``, a bad
input) and the entry stays as it was. The stages that fold inputs into per-key state check the entry they
are about to store (``admit``) before they send its outputs; ``tables.put`` checks every write again
(the backstop for every table), and the agent loop dead-letters an input whose write was refused there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from processors.errors import ProcessorError


class StateOverflow(ProcessorError):
    """An input would take its key's table entry past the table's budget: it is dead-lettered instead."""


@dataclass(frozen=True)
class StateBudget:
    max_bytes: int  # one entry, header and key included; below what Kafka takes as one record
    max_items: int  # things one entry holds (feedback, rollout ids, ...); 0: bytes only

    def exceeded(self, size: int, items: int = 0) -> bool:
        """Whether an entry of ``size`` bytes holding ``items`` things is over this budget."""
        return size > self.max_bytes or bool(self.max_items and items > self.max_items)

    def describe(self, size: int, items: int = 0) -> str:
        """What an entry of this size and count passes (for a dead letter's reason)."""
        return (f"{size:,} bytes against a budget of {self.max_bytes:,} (processors.max_key_state_bytes), "
                f"{items:,} items against {self.max_items:,} (processors.max_key_state_items)")

    def check(self, table: str, key: bytes, size: int, items: int = 0) -> None:
        """Raise StateOverflow naming the table, the key and the bound an entry of ``size`` bytes and
        ``items`` things passes."""
        name = key[:80].decode("utf-8", "replace")
        if size > self.max_bytes:
            raise StateOverflow(f"state of {name!r} in table {table} would be {size:,} bytes, over its "
                                f"budget of {self.max_bytes:,} (processors.max_key_state_bytes): input refused")
        if self.max_items and items > self.max_items:
            raise StateOverflow(f"state of {name!r} in table {table} would hold {items:,} items, over its "
                                f"budget of {self.max_items:,} (processors.max_key_state_items): input refused")


def bind(table: Any, budget: StateBudget) -> None:
    """Give ``table`` its budget (read by ``admit`` and by every ``tables.put``)."""
    table.state_budget = budget


def budget_of(table: Any) -> StateBudget | None:
    return getattr(table, "state_budget", None)


def admit(table: Any, key: bytes, value: bytes, items: int = 0) -> None:
    """Raise StateOverflow if writing ``value`` (a packed entry) under ``key`` would pass the table's budget."""
    budget: StateBudget | None = getattr(table, "state_budget", None)
    if budget is not None:
        budget.check(getattr(table, "name", "?"), key, len(key) + len(value), items)
