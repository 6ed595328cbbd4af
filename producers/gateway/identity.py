"""Which rollout attempt a model call belongs to, found without changing the harness.

In order of precedence: the path prefix ``/rollouts/{rollout_id}/attempts/{attempt_id}/v1/...``, the
``X-Rollout-Id`` / ``X-Attempt-Id`` headers (attempt defaults to the rollout's latest), or a per-attempt
API key minted by ``POST /v1/rollouts`` (``Authorization: Bearer`` or ``x-api-key``). Anything else is
unattributed: recorded under rollout id "unattributed" or refused, as configured.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from producers.gateway.attempts import AttemptRegistry, AttemptState
from producers.gateway.errors import GatewayError

# Harness session ids seen on the wire, first match wins.
SESSION_HEADERS = ("x-claude-code-session-id", "x-session-id", "session-id", "x-pi-session-id",
                   "x-openclaw-session-id", "x-conversation-id")
ROLLOUT_HEADER = "x-rollout-id"
ATTEMPT_HEADER = "x-attempt-id"


@dataclass(frozen=True)
class CallIdentity:
    state: AttemptState
    via: str  # "path" | "header" | "api_key" | "unattributed"
    session_id: str | None

    @property
    def rollout_id(self) -> str:
        return self.state.rollout_id

    @property
    def attempt_id(self) -> str:
        return self.state.attempt_id


def presented_key(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return headers.get("x-api-key") or None


def session_id_of(headers: Mapping[str, str]) -> str | None:
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return value[:200]
    return None


def is_admin(key: str | None, admin_key: str) -> bool:
    return bool(admin_key) and key is not None and hmac.compare_digest(key, admin_key)


def resolve_call(path_params: Mapping[str, str], headers: Mapping[str, str], registry: AttemptRegistry, *,
                 unattributed: str, require_auth: bool, admin_key: str) -> CallIdentity:
    """The attempt a call belongs to; raises GatewayError (404/409/401/400) when it cannot be served."""
    session = session_id_of(headers)
    key = presented_key(headers)
    if "rollout_id" in path_params:
        state = registry.get_active(path_params["rollout_id"], path_params["attempt_id"])
        _check_auth(registry, state, key, require_auth, admin_key)
        return CallIdentity(state, "path", session)
    rollout = headers.get(ROLLOUT_HEADER)
    if rollout:
        attempt = headers.get(ATTEMPT_HEADER) or registry.latest_attempt_id(rollout)
        state = registry.get_active(rollout, attempt)
        _check_auth(registry, state, key, require_auth, admin_key)
        return CallIdentity(state, "header", session)
    if key is not None and registry.is_minted_key(key):
        ids = registry.by_api_key(key)
        if ids is None:
            raise GatewayError(401, "unknown or expired rollout API key", "authentication",
                               code="invalid_api_key")
        return CallIdentity(registry.get_active(*ids), "api_key", session)
    if require_auth and not is_admin(key, admin_key):
        raise GatewayError(401, "this gateway requires a rollout API key (from POST /v1/rollouts)",
                           "authentication", code="invalid_api_key")
    if unattributed == "refuse":
        raise GatewayError(400, "no rollout identity: use the /rollouts/{rollout_id}/attempts/{attempt_id} "
                           "path prefix, the X-Rollout-Id header or a rollout API key",
                           code="rollout_required")
    return CallIdentity(registry.unattributed(session), "unattributed", session)


def _check_auth(registry: AttemptRegistry, state: AttemptState, key: str | None, require_auth: bool,
                admin_key: str) -> None:
    if not require_auth:
        return
    if key is not None and (hmac.compare_digest(key, state.api_key) or is_admin(key, admin_key)):
        return
    if key is not None and registry.by_api_key(key) is not None:
        # A valid key, but another attempt's: authenticated, not allowed here (isolation).
        raise GatewayError(403, "this API key belongs to another rollout attempt", "permission",
                           code="wrong_rollout")
    raise GatewayError(401, "this gateway requires the attempt's API key (from POST /v1/rollouts)",
                       "authentication", code="invalid_api_key")
