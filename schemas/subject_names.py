"""What a record stores in its ``subject`` field for a subject's name: a keyed pseudonym, not the name.

A subject's name is usually a user id (an organic session's key, the ``subject`` given when a rollout is
created), and the field is on every content-carrying record, in ClickHouse and in the data keys' ids on the
key topic: stored in the clear it tells any reader of the records who the users are. Stored is
``<readable prefix>subj:<32 hex>``, the hex an HMAC-SHA256 of the whole name under a key derived from the
operator's master key (``forget.master_key``), so only whoever holds that secret can tell whose records
are whose, or confirm a guessed id. The readable prefix is what retention and tenancy read from a subject:
a tenant's scope (``tenant:<name>:``, producers/gateway/tenants.py) and the part before the first ``/``
(``<tenant>/<user>``: per-tenant retention, ``ForgetSettings.retention_days``). Never put a user id there.

Both sides use this one mapping: the gateway when it writes a subject, ``tokentrail forget`` and
``POST /v1/admin/forget`` when they are given a name to forget (docs/forgetting.md, "Subjects"). Records
written before this mapping carry the name itself; ``forms`` gives both, so a forget by the name still
reaches them.
"""

from __future__ import annotations

import hashlib
import hmac

SUBJECT_MARK = "subj:"
SUBJECT_HEX = 32  # 128 bits: no two names of one deployment meet
_LABEL = b"tokentrail subject names v1"
_SCOPE = "tenant:"


def readable_prefix(name: str) -> str:
    """The part of ``name`` a stored subject keeps in the clear: a tenant scope, then a ``<tenant>/`` part."""
    prefix, rest = "", name
    if rest.startswith(_SCOPE) and ":" in rest[len(_SCOPE):]:
        tenant = rest[len(_SCOPE):].split(":", 1)[0]
        prefix = f"{_SCOPE}{tenant}:"
        rest = rest[len(prefix):]
    if "/" in rest:
        prefix += rest[:rest.index("/") + 1]
    return prefix


class SubjectNames:
    """Names to stored subjects under one deployment's secret (derived from its master key)."""

    def __init__(self, master_key: bytes) -> None:
        if not master_key:
            raise ValueError("forget.master_key is empty: subject names would be hashed under no secret")
        # A key of its own, derived: the master key itself is never used for two jobs.
        self._secret = hmac.new(master_key, _LABEL, hashlib.sha256).digest()

    def stored(self, name: str) -> str:
        """What records carry for the subject ``name`` (deterministic: every process and restart agrees)."""
        digest = hmac.new(self._secret, name.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
        return f"{readable_prefix(name)}{SUBJECT_MARK}{digest[:SUBJECT_HEX]}"

    def forms(self, name: str) -> tuple[str, ...]:
        """Every subject the records of ``name`` may carry: the pseudonym, then the name as given (records
        written before subjects were pseudonymised, or a pseudonym an operator read from ClickHouse)."""
        stored = self.stored(name)
        return (stored,) if stored == name else (stored, name)
