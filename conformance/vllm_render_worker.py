"""Runs in vLLM's own virtual environment: vLLM's chat render of requests over a JSON batch (stdin -> stdout).

Not imported by tokentrail (it imports only vLLM and the standard library); ``vllm_render.py`` starts it with
vLLM's Python. The render is the one vLLM's GPU-less render server (``vllm launch render``) performs for
``/v1/chat/completions``: the server's own argument parser, model config and app state
(``init_render_app_state``), then ``OnlineRenderer.render_chat`` on a ``ChatCompletionRequest`` built from the
request body; no socket, no weights. vLLM prepares the messages (``parse_chat_messages``: content format,
tool-call arguments as objects), renders the model directory's chat template with its own Jinja settings
and tokenizes the result.

``render_batch`` takes ``[{"key", "model" (a directory), "tool_call_parser", "messages", "tools",
"prompt_ids" (the gateway's, decoded here with vLLM's tokenizer), "anthropic" (an Anthropic Messages body, which
vLLM converts as its /v1/messages does, instead of "messages" and "tools"; optional)}]`` and gives, in order,
``{"key", "prompt_ids", "text", "gateway_text", "error"}``; ``vllm_worker.py`` calls it for the batch's ``renders``.
"""

from __future__ import annotations

import traceback
from typing import Any


async def _renderer(model: str, tool_call_parser: str | None) -> Any:
    from starlette.datastructures import State
    from vllm import AsyncEngineArgs
    from vllm.config import VllmConfig
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.entrypoints.launchers.render.app_state import init_render_app_state
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = ["--model", model, "--served-model-name", "conformance"]
    if tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    model_config = engine_args.create_model_config()
    model_config.quantization = None  # as the render server does: preprocessing only
    config = VllmConfig(model_config=model_config, logging_config=engine_args.create_logging_config(),
                        structured_outputs_config=engine_args.create_structured_outputs_config())
    state = State()
    await init_render_app_state(config, state, args)
    return state.online_renderer


def _chat_request(request: dict[str, Any]) -> Any:
    """The ``ChatCompletionRequest`` vLLM renders: an Anthropic Messages body converted by vLLM's own /v1/messages
    conversion (``AnthropicServingMessages.to_chat_completion_request``), else the chat messages and tools."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    if request.get("anthropic"):
        from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
        from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

        # only the prompt is rendered: an output budget over the model's context (Claude Code asks 128000) is not
        # what is judged, and vLLM would refuse it
        anthropic = AnthropicMessagesRequest.model_validate({**request["anthropic"], "model": "conformance",
                                                             "max_tokens": 1})
        return AnthropicServingMessages.to_chat_completion_request(anthropic)
    tools = request.get("tools") or None
    return ChatCompletionRequest(model="conformance", messages=request["messages"], tools=tools,
                                 tool_choice="auto" if tools else "none")


async def _render(renderer: Any, request: dict[str, Any]) -> list[int]:
    rendered = await renderer.render_chat(_chat_request(request))
    if not isinstance(rendered, tuple):  # an ErrorResponse
        raise ValueError(f"vLLM refuses the request: {rendered.model_dump_json()[:400]}")
    _, inputs = rendered
    return [int(i) for i in inputs[0]["prompt_token_ids"]]


async def render_batch(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    renderers: dict[tuple[str, str | None], Any] = {}
    results = []
    for request in requests:
        try:
            which = (request["model"], request.get("tool_call_parser"))
            if which not in renderers:
                renderers[which] = await _renderer(*which)
            renderer = renderers[which]
            ids = await _render(renderer, request)
            tokenizer = renderer.renderer.get_tokenizer()
            row: dict[str, Any] = {"prompt_ids": ids, "text": tokenizer.decode(ids, skip_special_tokens=False),
                                   "gateway_text": tokenizer.decode(request["prompt_ids"], skip_special_tokens=False),
                                   "error": None}
        except Exception as exc:  # one request's failure is that request's result, never the batch's
            row = {"prompt_ids": None, "text": None, "gateway_text": None,
                   "error": f"{type(exc).__name__}: {exc} | {traceback.format_exc(limit=3)[-600:]}"}
        results.append({"key": request.get("key"), **row})
    return results
