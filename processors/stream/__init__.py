"""The faust runtime of the processors: the app, its agents and tables, offsets and commits, the
watchdog, and the worker that runs it.

The stage logic stays in ``processors.assembler`` / ``processors.grouper`` / ``processors.pipeline``;
``processors.stream.app`` wires it to the topics with the helpers here (prefixed topics, table
entries, stream clocks, config). ``processors.stream.worker`` runs one worker from a StreamConfig,
which holds the kafka and processors settings sections the shell passes down.
"""
