"""The attempts' API keys: derived from a secret and the attempt's ids, so a restarted gateway (or another
replica sharing the secret) recognizes the keys minted before, without any key ever leaving the gateway.

``key = "tt-" + route_tag(rollout_id) + "." + base64url(HMAC-SHA256(secret, "rollout_id/attempt_id"))``:
unguessable without the secret, and recomputable from ids that are on Kafka anyway. The route tag (8 hex of
a hash of the rollout id, no secret in it) lets several gateway processes send a call that names its attempt
by the key alone to the process that owns the rollout (sticky.py) without knowing the key; a forged tag only
reaches another process, which refuses the key as any would. The secret, in order: ``gateway.key_secret``; else one
derived from ``gateway.admin_key`` (replicas that share the admin key share it); else a random secret kept
in a file beside the spool (0600), so a restart on the same host keeps it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path

API_KEY_PREFIX = "tt-"
SECRET_FILE_NAME = "attempt-key-secret"
# A secret shorter than this (an empty or truncated file) would let anyone compute every attempt key.
MIN_SECRET_BYTES = 16
_ADMIN_DERIVATION = b"tokentrail attempt keys v1"


ROUTE_TAG_CHARS = 8
_TAG_END = len(API_KEY_PREFIX) + ROUTE_TAG_CHARS
_HEX = frozenset("0123456789abcdef")


# An organic session window's rollout id (sessions.rollout_id_for): this prefix, 16 hex of the session key's
# hash (the key part, the same for all the key's windows), "-", 16 hex of the key and the window's start, and for
# a tenant's window "-" and 16 hex of its tenant's tag (session_refs.py).
ORGANIC_ROLLOUT_PREFIX = "session-"
_ORGANIC_ROLLOUT_ID = re.compile(r"session-[0-9a-f]{16}-[0-9a-f]{16}(?:-[0-9a-f]{16})?")
_KEY_PART_CHARS = len(ORGANIC_ROLLOUT_PREFIX) + 16


def owner_key(rollout_id: str) -> str:
    """What decides which gateway process owns a rollout: its id, or for an organic window its key part, so
    that the process the session's calls are routed to (by their key, sticky.session_tag) is the one that
    rebuilds the window from Kafka after a restart (by its rollout id, worker.py): one ownership for both."""
    return rollout_id[:_KEY_PART_CHARS] if _ORGANIC_ROLLOUT_ID.fullmatch(rollout_id) else rollout_id


def route_tag(rollout_id: str) -> str:
    """What gateway processes route a rollout's requests by: 8 hex digits of a BLAKE2b of its owner key."""
    return hashlib.blake2b(owner_key(rollout_id).encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()


def derive_api_key(secret: bytes, rollout_id: str, attempt_id: str) -> str:
    digest = hmac.new(secret, f"{rollout_id}/{attempt_id}".encode(), hashlib.sha256).digest()
    return f"{API_KEY_PREFIX}{route_tag(rollout_id)}.{base64.urlsafe_b64encode(digest[:24]).decode().rstrip('=')}"


def route_tag_of_key(api_key: str) -> str | None:
    """The route tag a minted key carries; None for anything else (a key of the older form, a forgery)."""
    if len(api_key) <= _TAG_END or api_key[_TAG_END] != "." or not api_key.startswith(API_KEY_PREFIX):
        return None
    tag = api_key[len(API_KEY_PREFIX):_TAG_END]
    return tag if _HEX.issuperset(tag) else None


def random_secret() -> bytes:
    return secrets.token_bytes(32)


def secret_from_admin_key(admin_key: str) -> bytes:
    return hmac.new(admin_key.encode("utf-8", "surrogatepass"), _ADMIN_DERIVATION, hashlib.sha256).digest()


class KeySecretError(ValueError):
    """The key secret cannot be used (an empty, short or unreadable file): the gateway must not start on it."""


def read_secret_file(path: Path) -> bytes:
    """The secret in ``path`` (hex), refused unless it is at least ``MIN_SECRET_BYTES`` long: an empty file
    (a truncated write, ``touch``, a volume mounted empty) would otherwise make the HMAC key empty."""
    text = path.read_text().strip()
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = b""
    if len(secret) < MIN_SECRET_BYTES:
        raise KeySecretError(
            f"the attempt-key secret file {path} holds {len(text)} characters, not at least {MIN_SECRET_BYTES} "
            f"bytes as hex: attempt keys would be computable from their ids. Delete the file (the gateway "
            f"writes a new random one, and keys minted before stop working) or put `openssl rand -hex 32` in "
            f"it, or set gateway.key_secret")
    return secret


def load_or_create_secret_file(path: Path) -> bytes:
    """The secret kept in ``path``; a new random one written there (0600, atomically) if there is none."""
    try:
        return read_secret_file(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(random_secret().hex())
        fh.flush()
        os.fsync(fh.fileno())
    try:
        os.link(tmp, path)  # first writer wins; a concurrent starter reads the winner's secret
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return read_secret_file(path)


def resolve_secret(key_secret: str, admin_key: str, secret_dir: Path | None) -> bytes:
    """The secret keys are derived from (see the module docstring for the order)."""
    if key_secret:
        return hashlib.sha256(key_secret.encode("utf-8", "surrogatepass")).digest()
    if admin_key:
        return secret_from_admin_key(admin_key)
    if secret_dir is not None:
        return load_or_create_secret_file(secret_dir / SECRET_FILE_NAME)
    return random_secret()
