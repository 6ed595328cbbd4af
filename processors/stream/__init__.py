"""Kafka plumbing of the faust processors app: prefixed topics, table entries, stream clocks, config.

The stage logic stays in ``processors.assembler`` / ``processors.grouper`` / ``processors.pipeline``;
``processors.faust_app`` wires it to the topics with these helpers.
"""
