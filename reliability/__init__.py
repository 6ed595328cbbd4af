"""Reliability: a bad-input corpus and fault scenarios run against the real gateway, worker and sink."""
