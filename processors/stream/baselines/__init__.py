"""Baselines without siblings in the stream (issue 21 item 4, docs/feedback.md): the pairing and baseline
agents, their messages, and ``wiring.py``, which gives them their topics and tables."""
