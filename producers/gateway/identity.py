"""Which rollout attempt a model call belongs to, found without changing the harness.

In order of precedence: the path prefix ``/rollouts/{rollout_id}/attempts/{attempt_id}/v1/...``, the
``X-Rollout-Id`` / ``X-Attempt-Id`` headers (attempt defaults to the rollout's latest), or a per-attempt
API key minted by ``POST /v1/rollouts`` (``Authorization: Bearer`` or ``x-api-key``). Anything else names
no attempt: with ``gateway.organic_sessions`` a call that carries a session key joins its session's attempt
(sessions.py); otherwise it is unattributed: recorded under rollout id "unattributed" or refused, as configured.

Authentication (docs/operations.md, "Security"): with ``gateway.admin_key`` set (or the deprecated
``gateway.require_auth``) every call needs a key: a call on an attempt (path or headers) the attempt's own
key or the admin key, an unattributed call the admin key; a minted key identifies its attempt on its own.
Keys are compared as UTF-8 bytes in constant time, so a key that is not ASCII is simply a wrong key.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from producers.gateway.attempt_state import AttemptState
from producers.gateway.attempts import AttemptRegistry
from producers.gateway.errors import GatewayError

# Harness session ids seen on the wire, first match wins.
SESSION_HEADERS = ("x-claude-code-session-id", "x-session-id", "session-id", "x-pi-session-id",
                   "x-openclaw-session-id", "x-conversation-id")
ROLLOUT_HEADER = "x-rollout-id"
# Evaluation traffic names the release pin it wants (``tokentrail release pin --label L``).
TRAFFIC_LABEL_HEADER = "x-tokentrail-traffic-label"
# The key that allows a caller to send that label (gateway.traffic_label_key), besides the admin key.
LABEL_KEY_HEADER = "x-tokentrail-label-key"
ATTEMPT_HEADER = "x-attempt-id"


@dataclass(frozen=True)
class CallIdentity:
    state: AttemptState
    via: str  # "path" | "header" | "api_key" | "session" (organic, sessions.py) | "unattributed"
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


def traffic_label_of(headers: Mapping[str, str], admin_key: str = "", label_key: str = "") -> str | None:
    """The release traffic label a request carries (a pin's label routes it to the pinned version), refused
    (403) from a caller not allowed to pin: a pinned call leaves the release comparison and picks its version,
    so anyone able to send it could steer which policy serves them. Allowed: the admin key, or ``label_key``
    in ``x-tokentrail-label-key``; everyone when neither key is set (a gateway without authentication)."""
    value = headers.get(TRAFFIC_LABEL_HEADER, "").strip()[:200]
    if not value or not (admin_key or label_key):
        return value or None
    if is_admin(presented_key(headers), admin_key):
        return value
    offered = headers.get(LABEL_KEY_HEADER)
    if label_key and offered is not None and keys_equal(offered, label_key):
        return value
    raise GatewayError(403, f"{TRAFFIC_LABEL_HEADER} is only honoured with the admin key or the traffic label key "
                            f"({LABEL_KEY_HEADER}); send the call without it to be routed as any other",
                       "permission", code="traffic_label_forbidden")


def session_id_of(headers: Mapping[str, str]) -> str | None:
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return value[:200]
    return None


def keys_equal(presented: str, expected: str) -> bool:
    """Constant-time comparison of two keys as UTF-8 bytes (``hmac.compare_digest`` refuses str arguments
    that are not ASCII; a header decoded as latin-1, or any other text, may hold anything)."""
    return hmac.compare_digest(presented.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass"))


def is_admin(key: str | None, admin_key: str) -> bool:
    return bool(admin_key) and key is not None and keys_equal(key, admin_key)


def auth_required(admin_key: str, require_auth: bool) -> bool:
    """Keys are needed on every route once an admin key is set; ``require_auth`` is its deprecated alias
    (without an admin key nothing can check who starts rollouts, so only the attempts' keys are needed)."""
    return bool(admin_key) or require_auth


def check_any_key(headers: Mapping[str, str], registry: AttemptRegistry, *, require_auth: bool,
                  admin_key: str) -> None:
    """Routes that belong to no attempt (listing models): any key this gateway issued, or the admin key."""
    if not auth_required(admin_key, require_auth):
        return
    key = presented_key(headers)
    if key is None or not (is_admin(key, admin_key) or registry.by_api_key(key) is not None):
        raise GatewayError(401, "this gateway requires an API key (a rollout's key from POST /v1/rollouts, "
                           "or the admin key)", "authentication", code="invalid_api_key")


def resolve_call(path_params: Mapping[str, str], headers: Mapping[str, str], registry: AttemptRegistry, *,
                 unattributed: str, require_auth: bool, admin_key: str,
                 ref_of: Callable[[str], str] | None = None) -> CallIdentity:
    """The attempt a call belongs to; raises GatewayError (404/409/401/400) when it cannot be served."""
    named = resolve_named(path_params, headers, registry, require_auth=require_auth, admin_key=admin_key,
                          ref_of=ref_of)
    return named if named is not None else resolve_unattributed(headers, registry, unattributed=unattributed,
                                                                ref_of=ref_of)


def stored_session_id(headers: Mapping[str, str], ref_of: Callable[[str], str] | None) -> str | None:
    """The harness session id as a call records it: its keyed ref (``SessionRefs.ref``, session_refs.py), never
    the id itself, which may be a user id (``x-session-id``). ``ref_of`` None (unit tests of routing alone)
    keeps the id."""
    session = session_id_of(headers)
    return session if session is None or ref_of is None else ref_of(session)


def resolve_named(path_params: Mapping[str, str], headers: Mapping[str, str], registry: AttemptRegistry, *,
                  require_auth: bool, admin_key: str, tenants: Any = None,
                  ref_of: Callable[[str], str] | None = None) -> CallIdentity | None:
    """The attempt the call names (path, headers or minted key), checked; None when it names none (and
    is allowed to: keys off, or the admin key). Organic sessions (sessions.py) take over from there."""
    session = stored_session_id(headers, ref_of)
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
    if auth_required(admin_key, require_auth) and not is_admin(key, admin_key) and not (
            tenants and tenants.of(key) is not None):  # a tenant's calls name no rollout (tenants.py)
        raise GatewayError(401, "this gateway requires a rollout API key (from POST /v1/rollouts) or, for "
                           "calls that name no rollout, a tenant key or the admin key", "authentication",
                           code="invalid_api_key")
    return None


def resolve_unattributed(headers: Mapping[str, str], registry: AttemptRegistry, *,
                         unattributed: str, ref_of: Callable[[str], str] | None = None) -> CallIdentity:
    """A call that names no attempt: the replica's per-session pseudo-attempt, or refused (400). Its attempt id
    carries the session's ref, as its records do."""
    session = stored_session_id(headers, ref_of)
    if unattributed == "refuse":
        raise GatewayError(400, "no rollout identity: use the /rollouts/{rollout_id}/attempts/{attempt_id} "
                           "path prefix, the X-Rollout-Id header or a rollout API key",
                           code="rollout_required")
    return CallIdentity(registry.unattributed(session), "unattributed", session)


def _check_auth(registry: AttemptRegistry, state: AttemptState, key: str | None, require_auth: bool,
                admin_key: str) -> None:
    if not auth_required(admin_key, require_auth):
        return
    check_attempt_key(registry, state, key, admin_key)


def check_attempt_key(registry: AttemptRegistry, state: AttemptState, key: str | None, admin_key: str) -> None:
    """The attempt's own key or the admin key; another attempt's valid key is a 403 (isolation), anything
    else a 401. Shared by model calls and the environment API."""
    if key is not None and (keys_equal(key, state.api_key) or is_admin(key, admin_key)):
        return
    if key is not None and registry.by_api_key(key) is not None:
        # A valid key, but another attempt's: authenticated, not allowed here (isolation).
        raise GatewayError(403, "this API key belongs to another rollout attempt", "permission",
                           code="wrong_rollout")
    raise GatewayError(401, "this attempt needs its own API key (from POST /v1/rollouts) or the admin key",
                       "authentication", code="invalid_api_key")
