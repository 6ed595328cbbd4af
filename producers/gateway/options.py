"""The gateway's behaviour as one value (``GatewayOptions``), read from the gateway and model settings; what
``app.Gateway`` is built from (tests and workers override fields with ``dataclasses.replace``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from producers.gateway.attempts import DEFAULT_MAX_BYTES, AttemptRegistry
from producers.gateway.keys import resolve_secret
from producers.gateway.session_refs import DEV_SESSION_REF_KEY
from producers.gateway.sessions import DEFAULT_KEY_SOURCES
from producers.gateway.settings import GatewayStackSettings


@dataclass
class GatewayOptions:
    """Gateway behaviour; ``from_settings`` reads it from the gateway and model settings sections."""

    model_name: str
    model_aliases: dict[str, str]
    prefix_mode: str = "splice"
    unattributed: str = "record"
    max_body_bytes: int = 8 * 1024 * 1024
    # Large bodies checked off the event loop first (body_checks.py; settings.py offload_body_bytes).
    offload_body_bytes: int = 256 * 1024
    body_check_processes: int = 1
    body_check_queue: int = 4
    max_tokens_limit: int = 4096
    # Set: every route but /health and /metrics needs a key (identity.py, docs/operations.md "Security").
    admin_key: str = ""
    # Deprecated alias of keys on every route, for gateways without an admin key (see settings.py).
    require_auth: bool = False
    # The attempt registry's memory budget and idle timeout (attempts.py).
    registry_max_bytes: int = DEFAULT_MAX_BYTES
    attempt_idle_timeout_s: float = 6 * 3600.0
    # The attempts' keys derive from this secret (keys.py); empty: from admin_key, else a file in
    # ``key_secret_dir`` (the spool's folder).
    key_secret: str = ""
    key_secret_dir: Path | None = None
    # Organic sessions (sessions.py): calls that name no rollout but carry a session key become attempts.
    organic_sessions: bool = False
    session_idle_s: float = 900.0
    session_key_sources: tuple[str, ...] = DEFAULT_KEY_SOURCES
    # Who may send a release traffic label (identity.traffic_label_of; settings.py traffic_label_key).
    traffic_label_key: str = ""
    # Tenants of organic traffic (tenants.py).
    tenant_keys: tuple[tuple[str, str], ...] = ()
    tenant_max_open_sessions: int = 1000
    # The secret of the keyed hashes of session keys (session_refs.py); the default is dev-only.
    session_ref_key: str = DEV_SESSION_REF_KEY

    @classmethod
    def from_settings(cls, settings: GatewayStackSettings) -> GatewayOptions:
        g = settings.gateway
        return cls(model_name=settings.model.name, model_aliases=dict(g.model_aliases),
                   prefix_mode=g.prefix_mode, unattributed=g.unattributed, max_body_bytes=g.max_body_bytes,
                   offload_body_bytes=g.offload_body_bytes, body_check_processes=g.body_check_processes,
                   body_check_queue=g.body_check_queue,
                   max_tokens_limit=g.max_tokens_limit, admin_key=g.admin_key, require_auth=g.require_auth,
                   registry_max_bytes=g.registry_max_bytes, attempt_idle_timeout_s=g.attempt_idle_timeout_s,
                   key_secret=g.key_secret, key_secret_dir=g.spool_dir,
                   organic_sessions=g.organic_sessions, session_idle_s=g.session_idle_s,
                   session_key_sources=tuple(g.session_key_sources), traffic_label_key=g.traffic_label_key,
                   tenant_keys=tuple(g.tenant_keys.items()), tenant_max_open_sessions=g.tenant_max_open_sessions,
                   session_ref_key=g.session_ref_key.get_secret_value())

    def make_registry(self) -> AttemptRegistry:
        secret = resolve_secret(self.key_secret, self.admin_key, self.key_secret_dir)
        return AttemptRegistry(max_bytes=self.registry_max_bytes, idle_ttl_s=self.attempt_idle_timeout_s,
                               key_secret=secret)
