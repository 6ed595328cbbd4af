"""Crypto-shredding of content: a record's content fields sealed under its subject's data key.

A record that names a subject (``subject``) is written with its content fields (bodies, message and tool
text, token arrays, feedback text; ``CONTENT_FIELDS``) encrypted into one envelope in ``sealed`` and the
fields themselves blanked: strings empty, byte arrays zero-filled to their length (lengths are facts the
audit keeps; the bytes are not). Opening it restores the fields and clears ``sealed``. Destroying the
subject's keys (``tokentrail forget``) makes every copy unreadable at once, in every topic, replay and
backup; a reader without the key keeps the blanked record with ``sealed`` still set: ``is_forgotten``.

Envelope: ``TTS1`` + key id length (u16 LE) + key id (UTF-8) + 12-byte nonce + AES-256-GCM ciphertext
with its 16-byte tag. The associated data binds it to its record (schema name, event id, subject, key id),
so an envelope cannot be moved onto another record. The plaintext is the content fields in the order of
``CONTENT_FIELDS``, each as a tag byte (0 null, 1 string, 2 bytes) + u32 LE length + the bytes.

Pure: no Kafka, no clock. Where keys come from is a ``Keyring`` (``schemas.kafka.key_store`` is the one of
record); ``MemoryKeyring`` is for tests and benchmarks.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

Record = dict[str, Any]

MAGIC = b"TTS1"
NONCE_LEN = 12
KEY_LEN = 32

# What is content, per record type: dotted paths, ``[]`` walks each item of an array. Everything else
# (ids, lengths, hashes, versions, logprobs, scores, weights, timings) stays readable for the audit.
CONTENT_FIELDS: dict[str, tuple[str, ...]] = {
    "CallRecord": ("request_json", "response_json", "prompt.ids", "prompt.new_ids", "output_ids"),
    "AttemptStarted": ("task_input_json",),
    "EnvStep": ("payload_json",),
    "AttemptFinished": ("final_artifacts_json",),
    "CompletedRollout": ("task_input_json", "final_artifacts_json", "final_output_text", "calls[].prompt.ids",
                         "calls[].prompt.new_ids", "calls[].output_ids", "env_events[].payload_json"),
    "Sample": ("input_ids",),
    "Feedback": ("details_json", "text"),
    "DeadLetter": ("value",),
}


class SealingError(ValueError):
    """An envelope that is malformed or does not belong to its record (never a missing key: that is a
    forgotten subject, not an error)."""


class Keyring(Protocol):
    def sealing_key(self, subject: str) -> tuple[str, bytes]:
        """(key id, 32-byte data key) to seal new content of ``subject`` with (made on first use)."""
        ...

    def opening_key(self, key_id: str) -> bytes | None:
        """The data key ``key_id`` names; None when it was destroyed (forgotten, expired) or never existed."""
        ...


def subject_of_key(key_id: str) -> str:
    """Key ids are ``subject#generation``."""
    return key_id.rsplit("#", 1)[0]


def new_data_key() -> bytes:
    return AESGCM.generate_key(bit_length=256)


def is_sealed_type(name: str) -> bool:
    return name in CONTENT_FIELDS


def is_forgotten(record: Record) -> bool:
    """True for a decoded record whose content could not be opened (its subject's key is gone)."""
    return record.get("sealed") is not None


def envelope_key_id(envelope: bytes) -> str:
    if envelope[:4] != MAGIC or len(envelope) < 6:
        raise SealingError("not a sealed-content envelope")
    (n,) = struct.unpack_from("<H", envelope, 4)
    return bytes(envelope[6:6 + n]).decode("utf-8")


# ---- paths ----------------------------------------------------------------------------------------


def _walk(record: Any, parts: list[str]) -> Iterator[tuple[Record, str]]:
    """(the dict holding the field, the field name) for every place ``parts`` reaches."""
    head, rest = parts[0], parts[1:]
    if head.endswith("[]"):
        for item in record.get(head[:-2]) or ():
            if rest:
                yield from _walk(item, rest)
        return
    if not rest:
        yield record, head
    elif record.get(head) is not None:
        yield from _walk(record[head], rest)


def _copy_along(record: Record, parts: list[str]) -> Record:
    """A copy of ``record`` in which every dict and list on ``parts`` is new (the rest shared), so blanking
    fields there leaves the caller's record untouched."""
    out = dict(record)
    head, rest = parts[0], parts[1:]
    if not rest:
        return out
    if head.endswith("[]"):
        key = head[:-2]
        if out.get(key) is not None:
            out[key] = [_copy_along(item, rest) for item in out[key]]
    elif out.get(head) is not None:
        out[head] = _copy_along(out[head], rest)
    return out


def content_places(name: str, record: Record) -> Iterator[tuple[Record, str]]:
    for path in CONTENT_FIELDS[name]:
        yield from _walk(record, path.split("."))


def _copied(name: str, record: Record) -> Record:
    out = record
    for path in CONTENT_FIELDS[name]:
        out = _copy_along(out, path.split("."))
    return out


# ---- payload --------------------------------------------------------------------------------------

_NULL, _STR, _BYTES = 0, 1, 2


def _pack(values: list[Any]) -> bytes:
    parts = []
    for v in values:
        if v is None:
            parts.append(struct.pack("<BI", _NULL, 0))
        elif isinstance(v, str):
            data = v.encode("utf-8", "surrogatepass")
            parts += [struct.pack("<BI", _STR, len(data)), data]
        else:
            data = bytes(v)
            parts += [struct.pack("<BI", _BYTES, len(data)), data]
    return b"".join(parts)


def _unpack(blob: bytes) -> list[Any]:
    out: list[Any] = []
    pos, view = 0, memoryview(blob)
    while pos < len(blob):
        tag, n = struct.unpack_from("<BI", blob, pos)
        pos += 5
        data = view[pos:pos + n]
        pos += n
        out.append(None if tag == _NULL else str(data, "utf-8", "surrogatepass") if tag == _STR else bytes(data))
    return out


def _blank(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, str):
        return ""
    return bytes(len(value))  # zeros: the length is a fact the audit keeps, the ids are content


def _aad(name: str, record: Record, key_id: str) -> bytes:
    return "\x00".join((name, str(record.get("event_id", "")), str(record.get("subject", "")), key_id)).encode()


# ---- seal / open ----------------------------------------------------------------------------------


class Sealer:
    """Seals records of subjects on the way out and opens them on the way in (the codec calls it)."""

    def __init__(self, keyring: Keyring, nonce: Callable[[], bytes] = lambda: os.urandom(NONCE_LEN)) -> None:
        self.keyring = keyring
        self._nonce = nonce

    def seal(self, name: str, record: Record) -> Record:
        """A copy of ``record`` with its content in ``sealed`` and blanked; unchanged when it has no
        subject, is already sealed, or its type carries no content."""
        subject = record.get("subject")
        if not subject or record.get("sealed") is not None or name not in CONTENT_FIELDS:
            return record
        key_id, key = self.keyring.sealing_key(subject)
        out = _copied(name, record)
        places = list(content_places(name, out))
        plaintext = _pack([holder[field] for holder, field in places])
        for holder, field in places:
            holder[field] = _blank(holder[field])
        nonce = self._nonce()
        kid = key_id.encode("utf-8")
        ciphertext = AESGCM(key).encrypt(nonce, plaintext, _aad(name, record, key_id))
        out["sealed"] = b"".join((MAGIC, struct.pack("<H", len(kid)), kid, nonce, ciphertext))
        return out

    def forget_keys(self, key_ids: list[str]) -> None:
        """A Forgotten event named these keys destroyed: unreadable here at once, not only after the keyring's
        next refresh (a reader that stored the event must not open the subject's records that follow it)."""
        forget = getattr(self.keyring, "forget_keys", None)
        if forget is not None:
            forget(key_ids)

    def open(self, name: str, record: Record) -> Record:
        """The record with its content restored and ``sealed`` cleared; as it is (blanked, ``sealed`` set)
        when its key is gone. Decoded records are the caller's own: opened in place."""
        envelope = record.get("sealed")
        if envelope is None or name not in CONTENT_FIELDS:
            return record
        key_id = envelope_key_id(envelope)
        key = self.keyring.opening_key(key_id)
        if key is None:
            return record
        start = 6 + len(key_id.encode("utf-8"))
        nonce, ciphertext = envelope[start:start + NONCE_LEN], envelope[start + NONCE_LEN:]
        try:
            plaintext = AESGCM(key).decrypt(bytes(nonce), bytes(ciphertext), _aad(name, record, key_id))
        except InvalidTag as exc:
            raise SealingError(f"{name} {record.get('event_id')}: the envelope does not open under key "
                               f"{key_id} (tampered, or moved from another record)") from exc
        places = list(content_places(name, record))
        values = _unpack(plaintext)
        if len(values) != len(places):
            raise SealingError(f"{name} {record.get('event_id')}: the envelope holds {len(values)} fields, "
                               f"the record has {len(places)} content places")
        for (holder, field), value in zip(places, values, strict=True):
            holder[field] = value
        record["sealed"] = None
        return record


class MemoryKeyring:
    """Data keys in memory (tests, benchmarks): one key per subject, ``destroy`` forgets a subject."""

    def __init__(self) -> None:
        self.keys: dict[str, bytes] = {}
        self.current: dict[str, str] = {}

    def sealing_key(self, subject: str) -> tuple[str, bytes]:
        key_id = self.current.get(subject)
        if key_id is None:
            key_id = f"{subject}#1"
            self.current[subject], self.keys[key_id] = key_id, new_data_key()
        return key_id, self.keys[key_id]

    def opening_key(self, key_id: str) -> bytes | None:
        return self.keys.get(key_id)

    def destroy(self, subject: str) -> list[str]:
        gone = [k for k in self.keys if subject_of_key(k) == subject]
        for k in gone:
            del self.keys[k]
        self.current.pop(subject, None)
        return gone


# ---- master-key wrapping of data keys (the key store's records) ------------------------------------


def wrap_key(master: bytes, key_id: str, data_key: bytes, nonce: bytes | None = None) -> bytes:
    nonce = nonce or os.urandom(NONCE_LEN)
    return nonce + AESGCM(master).encrypt(nonce, data_key, key_id.encode("utf-8"))


def unwrap_key(master: bytes, key_id: str, wrapped: bytes) -> bytes:
    try:
        return AESGCM(master).decrypt(wrapped[:NONCE_LEN], wrapped[NONCE_LEN:], key_id.encode("utf-8"))
    except InvalidTag as exc:
        raise SealingError(f"data key {key_id} does not unwrap under this master key") from exc
