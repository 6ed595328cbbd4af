"""``tokentrail gateway``: serve the OpenAI/Anthropic gateway on the embedded engine or a vLLM fleet.

Builds the reference model if it is missing, starts the Kafka publisher (with its local spool) and runs
uvicorn on ``producers.gateway.wiring.build_app``'s app.
"""

from __future__ import annotations

import argparse
import logging

from tokentrail.cli import CliError
from tokentrail.settings import Settings, get_settings


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


def _settings_with(args: argparse.Namespace) -> Settings:
    settings = get_settings()
    overrides = {"host": args.host, "port": args.port, "upstream": args.upstream,
                 "prefix_mode": args.prefix_mode, "unattributed": args.unattributed}
    gateway = settings.gateway.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    return settings.model_copy(update={"gateway": gateway})


def _run(args: argparse.Namespace) -> int:
    import uvicorn

    from producers.gateway.wiring import build_app

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = _settings_with(args)
    try:
        app = build_app(settings, policy_dir=settings.trainer.checkpoint_dir)
    except (OSError, ValueError) as exc:
        raise CliError(str(exc)) from exc
    g = settings.gateway
    print(f"tokentrail gateway on http://{g.host}:{g.port}  upstream={g.upstream}  "
          f"prefix_mode={g.prefix_mode}  kafka={settings.kafka.bootstrap_servers}  spool={g.spool_dir}",
          flush=True)
    # Harness clients keep connections open between turns; a short server keep-alive races their reuse.
    uvicorn.run(app, host=g.host, port=g.port, log_level=args.log_level.lower(), timeout_keep_alive=120)
    return 0
