"""The embedded reference model: the demo task (``task``), the chat template and its tokens (``template``),
the tokenizer (``tokenizer``), the weights and their format warm-up (``weights``, ``warmup``), file
fingerprints and the manifest (``fingerprint``), and the cached, atomic build (``build``). Import names
from the module that defines them."""
