"""The I/O of scoring, beside the pure verifiers (an adapter, like ``processors/stream/``): calling a
verifier in a thread or a fresh process with its time limit (``calls``), the namespace sandbox for
untrusted code (``sandbox``) and the verifier that runs a model's code in it (``unit_tests``)."""
