"""Verifier plugins (``module:Class``), the runner that turns their outcomes into Score records, and
the built-in pure verifiers: answer match, group rank, majority vote. The unit-test runner and the
thread/process isolation of calls do I/O and live in ``processors.isolation``."""

from processors.verifiers.base import (
    GroupVerifier,
    RolloutVerifier,
    RolloutView,
    Verifier,
    load_verifier,
    load_verifiers,
)
from processors.verifiers.runner import VerifierRunner, prior_raw, score_record

__all__ = ["GroupVerifier", "RolloutVerifier", "RolloutView", "Verifier", "VerifierRunner", "load_verifier",
           "load_verifiers", "prior_raw", "score_record"]
