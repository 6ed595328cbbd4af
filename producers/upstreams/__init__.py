"""Model upstreams behind the gateway: the ``Upstream`` protocol (``base``) and its two implementations,
a vLLM fleet over HTTP (``vllm``) and the embedded reference engine (``embedded``)."""
