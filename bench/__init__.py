"""Benchmarks: ``python -m bench.NAME``; each prints its figures and, last, one JSON object."""
