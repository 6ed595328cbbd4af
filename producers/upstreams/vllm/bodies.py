"""The request bodies of vLLM's three generation endpoints, each field written once.

* ``POST /v1/completions`` (token-in): ``prompt`` = the token ids the gateway rendered,
  ``return_token_ids`` (the engine's ``prompt_token_ids`` and sampled ``token_ids`` per choice) and
  ``logprobs: 1`` (``logprobs.token_logprobs`` holds the sampled token's logprob).
* ``POST /inference/v1/generate`` (token-in, servers with ``--enable-scale-out``): ``token_ids`` in,
  ``sampling_params`` nested, and the weight-version spans out (producers/upstreams/vllm/labels.py).
* ``POST /v1/chat/completions`` (the gateway's pass-through modes): vLLM renders the conversation; the
  gateway's own chat body, or the harness's body as is with token ids and logprobs asked for.

Pure: no HTTP here. The prompt ids arrive already serialized (``ids_json``), so a long prompt is turned into
JSON once per request and that same text is compared with what the engine echoes.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson

from producers.upstreams.base import ChatGenerateRequest, GenerateRequest, Sampling
from schemas.tokens import TokenIds

TokenEndpoint = Literal["completions", "generate"]
TOKEN_PATHS: dict[str, str] = {"completions": "/v1/completions", "generate": "/inference/v1/generate"}
CHAT_PATH = "/v1/chat/completions"

# Special tokens stay in the text as the ids have them: the text matches the ids the record keeps.
_KEEP_SPECIAL_TOKENS: dict[str, Any] = {"skip_special_tokens": False, "spaces_between_special_tokens": False}


def ids_json(ids: TokenIds) -> bytes:
    """Token ids (a list or the gateway's uint32 array) as JSON, embedded as is in a request body."""
    return orjson.dumps(ids, option=orjson.OPT_SERIALIZE_NUMPY)


def sampling_fields(s: Sampling) -> dict[str, Any]:
    """The sampling parameters of a vLLM request (the optional ones only when set)."""
    fields: dict[str, Any] = {"max_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p}
    if s.top_k > 0:
        fields["top_k"] = s.top_k
    if s.seed is not None:
        fields["seed"] = s.seed
    if s.stop_token_ids:
        fields["stop_token_ids"] = list(s.stop_token_ids)
    return fields


def _openai_stream(stream: bool) -> dict[str, Any]:
    """The OpenAI-compatible endpoints' streaming fields: the usage comes with the last chunk."""
    return {"stream": True, "stream_options": {"include_usage": True}} if stream else {}


def completion_body(model: str, request: GenerateRequest, prompt_json: bytes, stream: bool) -> dict[str, Any]:
    """The ``/v1/completions`` request for exact token-in generation."""
    return {
        "model": model,
        "prompt": orjson.Fragment(prompt_json),
        **sampling_fields(request.sampling),
        "logprobs": 1,
        "return_token_ids": True,
        # Token strings become "token_id:<id>", a cross-check of token_ids, never half a character.
        "return_tokens_as_token_ids": True,
        **_KEEP_SPECIAL_TOKENS,
        "request_id": request.request_id,
        **_openai_stream(stream),
    }


def generate_body(model: str, request: GenerateRequest, prompt_json: bytes, stream: bool) -> dict[str, Any]:
    """The ``/inference/v1/generate`` request: ids in, ids, logprobs and weight-version spans out."""
    # logprobs 0: the sampled token's own logprob only; no detokenizing (the gateway decodes).
    sampling = {**sampling_fields(request.sampling), "logprobs": 0, "detokenize": False}
    body: dict[str, Any] = {"model": model, "token_ids": orjson.Fragment(prompt_json), "sampling_params": sampling,
                            "return_token_ids": True, "request_id": request.request_id}
    if stream:
        body["stream"] = True  # this endpoint has no stream_options
    return body


TOKEN_BODIES = {"completions": completion_body, "generate": generate_body}


def chat_body(model: str, request: ChatGenerateRequest, stream: bool) -> dict[str, Any]:
    """The ``/v1/chat/completions`` request of the gateway's pass-through mode (the gateway's own body)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": request.messages,
        **sampling_fields(request.sampling),
        "logprobs": True,  # the sampled token's logprob, per token
        "return_token_ids": True,  # prompt_token_ids in the first chunk, token_ids in every chunk
        **_KEEP_SPECIAL_TOKENS,
        "request_id": request.request_id,
        **_openai_stream(stream),
    }
    if request.tools:
        # The template sees the tools; the gateway parses tool calls itself, so vLLM must not.
        body["tools"] = request.tools
        body["tool_choice"] = "none"
    if request.template_kwargs:
        body["chat_template_kwargs"] = request.template_kwargs
    return body


def passthrough_body(body: dict[str, Any], model: str, stream: bool) -> dict[str, Any]:
    """A harness's chat body forwarded as is, asking for token ids and the sampled tokens' logprobs (its
    ``top_logprobs`` and other stream options stay as it asked); ``model`` where it names none."""
    request = {"model": model, **body, "return_token_ids": True, "logprobs": True, "stream": stream}
    if stream:
        request["stream_options"] = {**_openai_stream(True)["stream_options"], **(body.get("stream_options") or {})}
    return request
