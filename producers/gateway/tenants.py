"""Tenants of organic traffic (issue 29 #6): per-tenant API keys that work beside the admin key.

A tenant key (``gateway.tenant_keys``: tenant name -> key) may make calls that name no rollout, and its
organic sessions live in the tenant's own namespace: the session key a call carries is prefixed with the
tenant (``tenant:<name>:<key>``), so another tenant sending the same ``X-Session-Id`` gets a window of its
own (it cannot join), and a tenant ends only its own sessions (another's key is unknown to it: 404). Its feedback
may name only its own targets (feedback_api.py, 403 otherwise): a rollout of its windows (told from the id
itself, session_refs.SessionRefs.owned_by, on any process and after a restart), a session in its namespace, or
a call (response) of its windows: by its call ref (in its response ids, SessionRefs.call_owned_by, any process),
or a bare call id this process served (remembered, bounded, newest kept). Each tenant
holds at most ``tenant_max_open_sessions`` open windows (429 beyond), so its organic starts cannot fill the
attempt registry and push out RL attempts."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping

from producers.gateway.errors import GatewayError
from producers.gateway.identity import keys_equal

SCOPE_PREFIX = "tenant:"
REMEMBERED_CALLS = 100_000  # call ids of tenants' calls kept for feedback checks (oldest dropped)


class Tenants:
    def __init__(self, keys: Mapping[str, str] | None = None, max_open_sessions: int = 1000,
                 remembered: int = REMEMBERED_CALLS) -> None:
        empty = [name for name, key in (keys or {}).items() if not key]
        if empty:
            raise ValueError(f"gateway.tenant_keys: tenants {empty} have an empty key")
        odd = [name for name in (keys or {}) if not name or ":" in name]
        if odd:
            raise ValueError(f"gateway.tenant_keys: tenant names {odd} must be non-empty, without ':'")
        self.keys = dict(keys or {})
        self.max_open_sessions = max_open_sessions
        self._remembered = remembered
        self._calls: OrderedDict[str, str] = OrderedDict()  # call id of a tenant's call -> tenant
        self.open: Counter[str] = Counter()  # tenant -> its open windows (sessions.py keeps it)

    def __bool__(self) -> bool:
        return bool(self.keys)

    def of(self, key: str | None) -> str | None:
        """The tenant whose key this is (every key compared, in constant time each), else None."""
        found = None
        for name, tenant_key in self.keys.items():
            if key is not None and keys_equal(key, tenant_key):
                found = name
        return found

    @staticmethod
    def scope(tenant: str, session_key: str) -> str:
        return f"{SCOPE_PREFIX}{tenant}:{session_key}"

    @staticmethod
    def unscoped(session_key: str) -> str:
        """The key as the caller sent it: what the front of ``--processes N`` routes by (it checks no keys),
        so a scoped key's rollouts must be owned by the process the unscoped key routes to (sessions.key_part)."""
        if not session_key.startswith(SCOPE_PREFIX):
            return session_key
        return session_key[len(SCOPE_PREFIX):].split(":", 1)[-1]

    @staticmethod
    def tenant_of_session(session_key: str) -> str | None:
        if not session_key.startswith(SCOPE_PREFIX):
            return None
        return session_key[len(SCOPE_PREFIX):].split(":", 1)[0]

    def check_room(self, tenant: str) -> None:
        if self.open[tenant] >= self.max_open_sessions:
            raise GatewayError(429, f"this tenant has {self.open[tenant]} open sessions, its limit; end one "
                               "(POST /v1/sessions/{key}/end) or let one go idle", "rate_limit",
                               code="tenant_session_limit")

    def remember_call(self, call_id: str, tenant: str) -> None:
        self._calls[call_id] = tenant
        self._calls.move_to_end(call_id)
        while len(self._calls) > self._remembered:
            self._calls.popitem(last=False)

    def owner_of_call(self, call_id: str | None) -> str | None:
        return None if call_id is None else self._calls.get(call_id)
