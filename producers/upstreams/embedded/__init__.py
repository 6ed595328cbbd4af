"""The embedded reference engine: a small transformers model on the CPU behind the ``Upstream`` protocol
(``engine``), its batched KV-cache decoding (``decode``) and per-row sampling math (``sampling``)."""
