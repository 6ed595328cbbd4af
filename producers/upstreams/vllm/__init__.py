"""The vLLM upstream: a fleet of vLLM servers behind the gateway, exact token ids in and out.

One job per module:

* ``client.py``: ``VLLMUpstream``, the Upstream the gateway calls; it puts the parts below together.
* ``fleet.py``: the servers and connections; a rollout's calls stick to one server (rendezvous order)
  and move on when a server is down or lost before its answer reached the caller.
* ``bodies.py``: the request bodies of ``/v1/completions``, ``/inference/v1/generate`` and
  ``/v1/chat/completions``, each field written once.
* ``answers.py``: reading the answers (SSE events, logprobs checked against ids, the echoed prompt).
* ``labels.py``: vLLM's weight labels and ``weight_versions`` spans (``WeightLabelSpan``) as policy
  versions.
* ``errors.py``: vLLM's error answers as the caller's errors.
* ``weights.py``: pushing new weights into the running servers.

Several policy versions served at once, one per server: ``producers/upstreams/vllm_versions.py``.
"""

from producers.upstreams.vllm.answers import ChatPassthrough, PassthroughChoice
from producers.upstreams.vllm.client import VLLMUpstream
from producers.upstreams.vllm.errors import ServerLost, VLLMError
from producers.upstreams.vllm.fleet import rendezvous_order
from producers.upstreams.vllm.labels import WeightLabelSpan, label_version, spans_from_text

__all__ = ["ChatPassthrough", "PassthroughChoice", "ServerLost", "VLLMError", "VLLMUpstream", "WeightLabelSpan",
           "label_version", "rendezvous_order", "spans_from_text"]
