"""``tokentrail gateway``: serve the OpenAI/Anthropic gateway on the embedded engine or a vLLM fleet.

Builds the reference model if it is missing, starts the Kafka sink (with its local spool) and runs
uvicorn. ``build_app`` is the same wiring for tests (see testing.py).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from starlette.applications import Starlette


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "gateway", help="run the model gateway (OpenAI + Anthropic protocols; call records to Kafka)",
        description="Serve OpenAI Chat Completions / Completions and Anthropic Messages on the embedded "
                    "reference engine or a vLLM fleet, recording every call to Kafka.")
    parser.add_argument("--host", default=None, help="listen address (default: settings gateway.host)")
    parser.add_argument("--port", type=int, default=None, help="listen port (default: settings gateway.port)")
    parser.add_argument("--upstream", default=None,
                        help="'embedded' or comma-separated vLLM base URLs "
                             "(default: settings gateway.upstream)")
    parser.add_argument("--prefix-mode", choices=["splice", "retokenize", "upstream"], default=None,
                        help="how chat prompts become ids: splice earlier sampled ids, retokenize the "
                             "history, or let the upstream render (pass-through) (default: settings)")
    parser.add_argument("--unattributed", choices=["record", "refuse"], default=None,
                        help="calls with no rollout identity: record them or refuse them (default: settings)")
    parser.add_argument("--log-level", default="info", help="uvicorn/gateway log level (default: info)")
    parser.set_defaults(func=_run)


def _settings_with(args: argparse.Namespace) -> Any:
    from tokentrail.settings import get_settings

    settings = get_settings()
    overrides = {"host": args.host, "port": args.port, "upstream": args.upstream,
                 "prefix_mode": args.prefix_mode, "unattributed": args.unattributed}
    gateway = settings.gateway.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    return settings.model_copy(update={"gateway": gateway})


def make_upstream(settings: Any, progress: Any = print) -> Any:
    """The embedded reference engine (building the model if needed) or a vLLM client."""
    spec = settings.gateway.upstream.strip()
    if spec == "embedded":
        from producers.engines.embedded import EmbeddedEngine
        from producers.model_build import build_model

        model_dir = build_model(settings.model.dir, progress=progress)
        return EmbeddedEngine(model_dir)
    from producers.upstreams.vllm import VLLMUpstream

    return VLLMUpstream.from_settings(settings)


def make_text_side(settings: Any, progress: Any = print) -> Any:
    from producers.gateway.text_side import ModelTextSide
    from producers.model_build import build_model

    if settings.gateway.upstream.strip() == "embedded":
        build_model(settings.model.dir, progress=progress)
    text = ModelTextSide.from_dir(settings.model.dir, fast_ascii=settings.gateway.fast_ascii_tokenize)
    fast = text.renderer.token_cache.ascii_encoder is not None
    progress("ASCII text is tokenized by the exact fast path" if fast else
             "the tokenizer tokenizes all text (fast ASCII path off by setting, or not covered for this tokenizer)")
    return text


def build_app(settings: Any, *, upstream: Any = None, sink: Any = None, text: Any = None,
              progress: Any = print, **create_kwargs: Any) -> Starlette:
    """The standard app: given parts are used as they are, missing ones are made from ``settings``."""
    from producers.delivery import KafkaCallSink
    from producers.gateway.app import create_app

    text = text if text is not None else make_text_side(settings, progress)
    upstream = upstream if upstream is not None else make_upstream(settings, progress)
    sink = sink if sink is not None else KafkaCallSink.from_settings(settings)
    create_kwargs.setdefault("close_upstream", True)
    create_kwargs.setdefault("policy_dir", settings.trainer.checkpoint_dir)
    return create_app(settings, upstream, sink, text, **create_kwargs)


def _run(args: argparse.Namespace) -> int:
    import uvicorn

    from tokentrail.cli import CliError

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = _settings_with(args)
    try:
        app = build_app(settings)
    except (OSError, ValueError) as exc:
        raise CliError(str(exc)) from exc
    g = settings.gateway
    print(f"tokentrail gateway on http://{g.host}:{g.port}  upstream={g.upstream}  "
          f"prefix_mode={g.prefix_mode}  kafka={settings.kafka.bootstrap_servers}  spool={g.spool_dir}",
          flush=True)
    # Harness clients keep connections open between turns; a short server keep-alive races their reuse.
    uvicorn.run(app, host=g.host, port=g.port, log_level=args.log_level.lower(), timeout_keep_alive=120)
    return 0
