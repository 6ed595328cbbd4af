"""``tokentrail gateway``: serve the OpenAI/Anthropic gateway on the embedded engine or a vLLM fleet.

Builds the reference model if it is missing, starts the Kafka publisher (with its local spool) and runs
uvicorn on ``producers.gateway.wiring.build_app``'s app. With ``--processes N`` (``gateway.processes``) it
supervises N worker processes on the one port instead (producers/gateway/supervisor.py, worker.py, peers.py):
each is this command again with a hidden ``--worker-index``, and every session's calls are served by the
worker that owns the session (sticky.py).

Secure by default: it refuses to listen on any address but loopback unless ``gateway.admin_key`` is set
(which turns keys on for every route); ``--insecure-listen`` overrides that, loudly, for a gateway that
sits behind something else that authenticates its callers.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import socket
import sys

from schemas.topics import CALLS_TOPIC, ENV_TOPIC
from tokentrail.errors import CliError
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
    parser.add_argument("--processes", type=int, default=None, metavar="N",
                        help="worker processes on the one port, each session served by one of them; a crashed "
                             "worker is restarted (default: settings gateway.processes, 1)")
    parser.add_argument("--calls-topic", default=None, help=f"call records' topic (default: {CALLS_TOPIC})")
    parser.add_argument("--env-topic", default=None, help=f"environment events' topic (default: {ENV_TOPIC})")
    parser.add_argument("--log-level", default="info", help="uvicorn/gateway log level (default: info)")
    parser.add_argument("--insecure-listen", action="store_true",
                        help="listen on a non-loopback address without an admin key (no authentication: "
                             "only behind a proxy or network that authenticates every caller)")
    # Internal: one worker of --processes N (the supervisor starts them).
    parser.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--peer-ports", default=None, help=argparse.SUPPRESS)
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
                 "prefix_mode": args.prefix_mode, "unattributed": args.unattributed, "processes": args.processes}
    gateway = settings.gateway.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    return settings.model_copy(update={"gateway": gateway})


def _topics(args: argparse.Namespace) -> dict[str, str] | None:
    given = {"calls_topic": args.calls_topic, "env_topic": args.env_topic}
    return {k: v for k, v in given.items() if v} or None


def _run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = _settings_with(args)
    if not 1 <= settings.gateway.processes <= 64:
        raise CliError(f"--processes must be 1 to 64, not {settings.gateway.processes}")
    check_listen(settings, args.insecure_listen)
    if args.worker_index is not None:
        return _run_worker(args, settings)
    if settings.gateway.processes > 1:
        return _supervise(args, settings)
    import uvicorn

    from producers.gateway.wiring import build_app

    try:
        app = build_app(settings, upstream=_upstream(settings), policy_dir=settings.trainer.checkpoint_dir,
                        topics=_topics(args))
    except (OSError, ValueError) as exc:
        raise CliError(str(exc)) from exc
    app.state.gateway.body_checks.warm()  # its processes start now, not on the first large body
    g = settings.gateway
    print(f"tokentrail gateway on http://{g.host}:{g.port}  upstream={g.upstream}  "
          f"prefix_mode={g.prefix_mode}  kafka={settings.kafka.bootstrap_servers}  spool={g.spool_dir}",
          flush=True)
    # Harness clients keep connections open between turns; a short server keep-alive races their reuse.
    uvicorn.run(app, host=g.host, port=g.port, log_level=args.log_level.lower(), timeout_keep_alive=120)
    return 0


def _upstream(settings: Settings) -> object | None:
    """The vLLM upstream gated by the weight sync when ``weight_sync.in_gateway`` is on, else None (the
    wiring makes the settings' upstream)."""
    if settings.weight_sync.in_gateway and settings.gateway.upstream.strip() != "embedded":
        from tokentrail.runtime.weight_sync import gateway_upstream

        return gateway_upstream(settings)  # vLLM kept on the trainer's versions; calls record theirs
    return None


def _supervise(args: argparse.Namespace, settings: Settings) -> int:
    """``--processes N``: start N workers (this command with ``--worker-index``) and keep them running."""
    from producers.gateway.keys import KeySecretError, resolve_secret
    from producers.gateway.supervisor import Supervisor

    g = settings.gateway
    try:  # once here: a secret every worker would refuse must not become N workers restarted forever
        resolve_secret(g.key_secret, g.admin_key, g.spool_dir)
    except (KeySecretError, OSError) as exc:
        raise CliError(str(exc)) from exc
    if settings.weight_sync.in_gateway and g.upstream.strip() != "embedded":
        raise CliError("weight_sync.in_gateway runs one weight sync per gateway process, and several would "
                       "pause and reload the same vLLM servers each on their own: with --processes above 1 run "
                       "`tokentrail weight-sync` beside the gateway instead")
    peer_ports = ",".join(str(_free_loopback_port()) for _ in range(g.processes))
    worker_args = [sys.executable, "-m", "tokentrail.cli", "gateway", "--host", g.host, "--port", str(g.port),
                   "--upstream", g.upstream, "--prefix-mode", g.prefix_mode, "--unattributed", g.unattributed,
                   "--log-level", args.log_level, "--peer-ports", peer_ports]
    for flag, value in (("--calls-topic", args.calls_topic), ("--env-topic", args.env_topic)):
        if value:
            worker_args += [flag, value]
    if args.insecure_listen:
        worker_args.append("--insecure-listen")
    print(f"tokentrail gateway on http://{g.host}:{g.port}: {g.processes} worker processes (peer ports "
          f"{peer_ports})  upstream={g.upstream}  prefix_mode={g.prefix_mode}  "
          f"kafka={settings.kafka.bootstrap_servers}  spools={g.spool_dir}/worker-*", flush=True)

    def log(line: str) -> None:
        print(f"tokentrail gateway: {line}", flush=True)

    return Supervisor(lambda index: [*worker_args, "--worker-index", str(index)], g.processes, log=log).run()


def _free_loopback_port() -> int:
    """A port free now on loopback; a worker keeps it for its life and its restarts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_worker(args: argparse.Namespace, settings: Settings) -> int:
    from producers.gateway.worker import build_worker_app, serve_worker

    if not args.peer_ports:
        raise CliError("--worker-index needs --peer-ports (workers are started by `tokentrail gateway --processes N`)")
    peer_ports = [int(p) for p in args.peer_ports.split(",")]
    index = args.worker_index
    if not 0 <= index < len(peer_ports):
        raise CliError(f"--worker-index {index} is not one of the {len(peer_ports)} workers")
    try:
        router = build_worker_app(settings, index, peer_ports, topics=_topics(args),
                                  upstream=_upstream(settings), policy_dir=settings.trainer.checkpoint_dir)
    except (OSError, ValueError) as exc:
        raise CliError(str(exc)) from exc
    print(f"tokentrail gateway worker {index} of {len(peer_ports)} (pid {os.getpid()}) on "
          f"http://{settings.gateway.host}:{settings.gateway.port}, peers on port {peer_ports[index]}", flush=True)
    serve_worker(router, settings.gateway.host, settings.gateway.port, log_level=args.log_level)
    return 0
