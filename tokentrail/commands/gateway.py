"""``tokentrail gateway``: serve the OpenAI/Anthropic gateway on the embedded engine or a vLLM fleet.

Builds the reference model if it is missing, starts the Kafka publisher (with its local spool) and runs
uvicorn on ``producers.gateway.wiring.build_app``'s app.

Secure by default: it refuses to listen on any address but loopback unless ``gateway.admin_key`` is set
(which turns keys on for every route); ``--insecure-listen`` overrides that, loudly, for a gateway that
sits behind something else that authenticates its callers.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys

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
    parser.add_argument("--insecure-listen", action="store_true",
                        help="listen on a non-loopback address without an admin key (no authentication: "
                             "only behind a proxy or network that authenticates every caller)")
    parser.set_defaults(func=_run)


ADMIN_KEY_VAR = "TOKENTRAIL_GATEWAY__ADMIN_KEY"


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and localhost; anything else (0.0.0.0, ::, other names) may be reached from outside."""
    name = host.strip().removeprefix("[").removesuffix("]").rstrip(".").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_listen(settings: Settings, insecure_listen: bool) -> None:
    """Refuse (CliError) a non-loopback address without an admin key, unless overridden (then warn)."""
    g = settings.gateway
    if g.admin_key or is_loopback(g.host):
        if g.require_auth and not g.admin_key:
            print(f"tokentrail gateway: warning: gateway.require_auth is deprecated; set {ADMIN_KEY_VAR}, which "
                  "turns keys on for every route (without it anyone can start rollouts)", file=sys.stderr)
        return
    if not insecure_listen:
        raise CliError(
            f"refuses to listen on {g.host!r} without authentication: anyone who can reach it could start "
            f"rollouts, read their keys and write training data. Set {ADMIN_KEY_VAR} (gateway.admin_key; "
            f"e.g. `export {ADMIN_KEY_VAR}=$(openssl rand -hex 32)`), which turns keys on for every route, "
            "listen on 127.0.0.1, or pass --insecure-listen if a proxy in front authenticates every caller")
    print(f"tokentrail gateway: WARNING: listening on {g.host!r} without authentication (--insecure-listen): "
          "anyone who can reach this address can start rollouts and make model calls; set "
          f"{ADMIN_KEY_VAR} instead", file=sys.stderr, flush=True)


def _settings_with(args: argparse.Namespace) -> Settings:
    settings = get_settings()
    overrides = {"host": args.host, "port": args.port, "upstream": args.upstream,
                 "prefix_mode": args.prefix_mode, "unattributed": args.unattributed}
    gateway = settings.gateway.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    return settings.model_copy(update={"gateway": gateway})


def _run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = _settings_with(args)
    check_listen(settings, args.insecure_listen)
    import uvicorn

    from producers.gateway.wiring import build_app

    upstream = None
    if settings.weight_sync.in_gateway and settings.gateway.upstream.strip() != "embedded":
        from tokentrail.commands.weight_sync import gateway_upstream

        upstream = gateway_upstream(settings)  # vLLM kept on the trainer's versions; calls record theirs
    try:
        app = build_app(settings, upstream=upstream, policy_dir=settings.trainer.checkpoint_dir)
    except (OSError, ValueError) as exc:
        raise CliError(str(exc)) from exc
    g = settings.gateway
    print(f"tokentrail gateway on http://{g.host}:{g.port}  upstream={g.upstream}  "
          f"prefix_mode={g.prefix_mode}  kafka={settings.kafka.bootstrap_servers}  spool={g.spool_dir}",
          flush=True)
    # Harness clients keep connections open between turns; a short server keep-alive races their reuse.
    uvicorn.run(app, host=g.host, port=g.port, log_level=args.log_level.lower(), timeout_keep_alive=120)
    return 0
