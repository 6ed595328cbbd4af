"""Baselines without siblings (issue 21, item 4): rollouts grouped by a key over event-time windows, and a
running baseline per key where a window's group is too small. Pure: no Kafka, no clock."""
