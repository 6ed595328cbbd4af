"""The feedback join's stream parts (issue 21, docs/feedback.md): router, resolver and join agents, their
messages and dead letters, and ``wiring.py``, which gives them their topics and tables."""
