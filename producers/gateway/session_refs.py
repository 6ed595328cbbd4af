"""What stands for an organic session's key wherever the gateway writes or routes by it (issue 29, keyed refs).

A session key is often guessable (a user id, a harness session id), so a plain hash of it in a stored record
lets anyone holding the records confirm a guess. Every value derived from a key (the ``session_ref`` of an
``AttemptStarted``, a call record's ``session_id`` and a SESSION feedback target, the key part and window part
of a window's rollout id, the route tag the processes of ``--processes N`` share) is an HMAC-SHA256 under
``gateway.session_ref_key``, the operator's secret (``TOKENTRAIL_GATEWAY__SESSION_REF_KEY``), each use under
its own label so one value says nothing of another.

Every gateway process and replica that serves the same sessions needs the same key: the key part routes a
session's calls to the process that owns its window. Rotating the key changes every value from then on; what
is stored keeps the values it was written with (docs/feedback.md, "Session refs and key rotation").
"""

from __future__ import annotations

import hashlib
import hmac
import re

from producers.gateway.keys import ORGANIC_ROLLOUT_PREFIX
from producers.gateway.tenants import Tenants
from schemas.feedback import CALL_REF_SEP, split_call_ref

# DEV ONLY. The key a gateway uses when the operator gives none, so the demo and tests run out of the box;
# anyone can read this line, so refs made under it protect a guessable key from nothing. Production sets
# TOKENTRAIL_GATEWAY__SESSION_REF_KEY (a long random secret from the operator's secret store).
DEV_SESSION_REF_KEY = "tokentrail-DEV-ONLY-session-ref-key-set-TOKENTRAIL_GATEWAY__SESSION_REF_KEY"
REF_PREFIX = "hmac:"
REF_HEX = 32
_STORED_REF = re.compile(r"(tenant:[^:]+:)?hmac:[0-9a-f]{32}")
_TENANT_WINDOW = re.compile(r"(session-[0-9a-f]{16}-[0-9a-f]{16})-([0-9a-f]{16})")


def is_tenant_window(rollout_id: str) -> bool:
    """Whether the id has the shape of a tenant's window (whosever): callers without a key may not name one."""
    return _TENANT_WINDOW.fullmatch(rollout_id) is not None


def is_stored_ref(value: str) -> bool:
    """Whether ``value`` has the shape of a stored ref (``SessionRefs.ref``), a tenant's scoped ref included."""
    return _STORED_REF.fullmatch(value) is not None


class SessionRefs:
    """The keyed hashes of session keys: one secret, one HMAC, a label per use."""

    def __init__(self, secret: str | bytes) -> None:
        raw = secret.encode("utf-8", "surrogatepass") if isinstance(secret, str) else secret
        if not raw:  # an empty HMAC key would make every ref computable from the key alone (issue 29 #8)
            raise ValueError("gateway.session_ref_key is empty; set TOKENTRAIL_GATEWAY__SESSION_REF_KEY")
        self._secret = raw

    @property
    def is_dev_key(self) -> bool:
        return hmac.compare_digest(self._secret, DEV_SESSION_REF_KEY.encode())

    def _hex(self, label: str, *parts: str) -> str:
        message = "\x00".join((label, *parts)).encode("utf-8", "surrogatepass")
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def ref(self, key: str) -> str:
        """What stands for a session key in records and in memory: ``hmac:`` + 32 hex, behind its tenant's
        scope for a tenant's key (``tenant:<name>:hmac:...``, so the tenant stays known)."""
        ref = REF_PREFIX + self._hex("ref", key)[:REF_HEX]
        tenant = Tenants.tenant_of_session(key)
        return ref if tenant is None else Tenants.scope(tenant, ref)

    def session_target(self, session_id: str) -> str:
        """A feedback target's session id as calls record it: the ref of the id a harness sent, or the ref
        itself where the poster gives one read from the records (a call's ``session_id`` is always a ref)."""
        return session_id if is_stored_ref(session_id) else self.ref(session_id)

    def key_part(self, key: str) -> str:
        """What every rollout id of the key's windows starts with (``session-`` + 16 hex). A tenant's scoped
        key has the part of the key its calls carry (the front of ``--processes N`` routes by it before any key
        check); its windows' rollout ids still differ from another tenant's, by the window part."""
        return ORGANIC_ROLLOUT_PREFIX + self._hex("key", Tenants.unscoped(key))[:16]

    def rollout_id_for(self, key: str, window_start_us: int) -> str:
        """The rollout of the key's window that began at ``window_start_us`` (its first call's arrival, unix
        microseconds). Deterministic in the two (and the secret), so a restart rebuilding the window from its
        AttemptStarted (which carries both) names the same rollout; hashed, so a user id does not become a
        Kafka key and the id always fits the rollout id pattern (keys.owner_key)."""
        rollout_id = f"{self.key_part(key)}-{self._hex('window', key, str(window_start_us))[:16]}"
        tenant = Tenants.tenant_of_session(key)
        return rollout_id if tenant is None else f"{rollout_id}-{self._tenant_tag(tenant, rollout_id)}"

    # A tenant's window carries its tenant's tag (a keyed hash of the tenant and the rest of the id), so any
    # process or replica holding the secret tells whose window a rollout is from its id alone: a tenant's
    # feedback is checked the same on a process that never served the session and after a restart.

    def _tenant_tag(self, tenant: str, rollout_id: str) -> str:
        return self._hex("tenant", tenant, rollout_id)[:16]

    # A tenant's call is answered as its call ref, ``<call id>.<tag>`` (its response ids carry it), the tag keyed
    # on the tenant and the call id: feedback naming the call or response is checked on any process.

    def call_ref(self, call_id: str, tenant: str) -> str:
        return f"{call_id}{CALL_REF_SEP}{self._hex('call-tenant', tenant, call_id)[:16]}"

    def call_owned_by(self, call_ref: str, tenant: str) -> bool:
        """Whether ``call_ref`` is a call ref of one of ``tenant``'s calls (a bare call id is not)."""
        call_id, tag = split_call_ref(call_ref)
        return tag is not None and hmac.compare_digest(tag, self._hex("call-tenant", tenant, call_id)[:16])

    def owned_by(self, rollout_id: str, tenant: str) -> bool:
        """Whether ``rollout_id`` is a window of one of ``tenant``'s sessions."""
        found = _TENANT_WINDOW.fullmatch(rollout_id)
        return found is not None and hmac.compare_digest(found[2], self._tenant_tag(tenant, found[1]))
