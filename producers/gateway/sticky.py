"""Which of several gateway processes owns a request's state: pure functions, no I/O.

Per-session state lives in one process: an attempt's call counters and kept prompts and outputs (splicing,
prompt deltas; attempts.py), an organic session's open window (sessions.py), the unattributed pseudo-attempt
of a harness session, the release's stickiness. So every request about one session must reach one process.
``route_of`` reads what names the session, in the order the app itself resolves it (identity.py, then
sessions.py), and gives a ``Route``: its kind and a 32-bit route tag (``keys.route_tag``, 8 hex digits);
``owner`` is the tag modulo the number of processes. The same in every process and run.

| what the request carries (first match) | kind | tag of |
| --- | --- | --- |
| path ``/rollouts/{rid}/...`` or ``/v1/rollouts/{rid}/...`` | rollout | the rollout id |
| path ``/v1/sessions/{key}/end`` | session | the session key |
| ``X-Rollout-Id`` header | rollout | the rollout id |
| a minted attempt key (``tt-<tag>.<mac>``, keys.py) | api_key | the rollout id (carried in the key) |
| a model call's organic session key (``gateway.session_key_sources``; organic sessions on) | session | the key's part |
| a model call's harness session header (``X-Session-Id`` and the like) | harness_session | the header's value |

A harness session header and an organic session key taken from it share a tag (both are the header's value),
so turning organic sessions on or off keeps a session where it was. A session key is tagged by its key part
(``SessionRefs.key_part``), which begins every rollout id of its windows and is what ``keys.route_tag`` hashes for
such an id: the process a session's calls reach owns its windows' rollouts, and rebuilds them after a restart.
Anything else (no session at all, /health, /v1/models, feedback, a start without an id) has no route and is
served where it lands. A process that starts a rollout without an id given mints one it owns
(``mint_owned_rollout_id``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from producers.gateway.identity import presented_key, session_id_of
from producers.gateway.keys import API_KEY_PREFIX, route_tag, route_tag_of_key
from producers.gateway.session_refs import DEV_SESSION_REF_KEY, SessionRefs
from producers.gateway.sessions import DEFAULT_KEY_SOURCES, MAX_KEY_CHARS, session_key

ROLLOUT_HEADER = b"x-rollout-id"
# Set on a request one process passes to another, which then serves it whatever it hashes to.
FORWARDED_HEADER = b"x-tokentrail-forwarded"
START_PATH = "/v1/rollouts"
SESSION_PATH, SESSION_END = "/v1/sessions/", "/end"
# The model routes (served at /v1/... and under the attempt prefix) and the protocol of their bodies.
MODEL_PATHS: dict[str, str] = {"/v1/chat/completions": "openai", "/v1/completions": "openai",
                               "/v1/responses": "openai", "/v1/messages": "anthropic",
                               "/v1/messages/count_tokens": "anthropic"}
BODY_SOURCES = frozenset({"openai.user", "anthropic.metadata.user_id"})


@dataclass(frozen=True)
class RoutingPolicy:
    """What of the gateway's settings decides a request's session (the same as the app is given)."""

    organic_sessions: bool = False
    session_key_sources: tuple[str, ...] = DEFAULT_KEY_SOURCES
    admin_key: str = ""
    # The keyed hashes of session keys (the app's, gateway.session_ref_key): a session's tag is its windows'.
    refs: SessionRefs = field(default_factory=lambda: SessionRefs(DEV_SESSION_REF_KEY))


@dataclass(frozen=True)
class Route:
    kind: str  # "rollout" | "api_key" | "session" | "harness_session"
    tag: str  # 8 hex digits (keys.route_tag)


def owner(route: Route, processes: int) -> int:
    """The process (0 .. processes-1) that owns the route's state."""
    return int(route.tag, 16) % processes


def owner_of(rollout_id: str, processes: int) -> int:
    """The process that owns ``rollout_id`` (and every request that names it)."""
    return owner(Route("rollout", route_tag(rollout_id)), processes)


def session_tag(key: str, refs: SessionRefs) -> str:
    """The tag of a session key: that of its windows' rollout ids (keys.owner_key), so the process its calls
    reach is the one that owns, and after a restart rebuilds, its open window."""
    return route_tag(refs.key_part(key[:MAX_KEY_CHARS]))


def rollout_in_path(path: str) -> str | None:
    """The rollout id a route's path names, if any."""
    if path.startswith("/rollouts/"):
        rest = path[len("/rollouts/"):]
    elif path.startswith(START_PATH + "/"):
        rest = path[len(START_PATH) + 1:]
    else:
        return None
    rollout_id = rest.split("/", 1)[0]
    return rollout_id or None


def model_protocol(path: str) -> str | None:
    """The protocol of a model route's body ("openai" | "anthropic"), None for any other path."""
    if path.startswith("/rollouts/"):  # /rollouts/{rid}/attempts/{aid}/v1/...
        parts = path.split("/", 5)
        path = "/" + parts[5] if len(parts) == 6 else ""
    return MODEL_PATHS.get(path)


def wants_body(path: str, headers: Mapping[str, str], policy: RoutingPolicy) -> bool:
    """Whether ``route_of`` may need the body: a model call that names no attempt, with organic sessions
    keyed (also) by a field of the body. Everything else is routed by its path and headers alone."""
    if not policy.organic_sessions or BODY_SOURCES.isdisjoint(policy.session_key_sources):
        return False
    if model_protocol(path) is None or rollout_in_path(path) is not None:
        return False
    return not headers.get("x-rollout-id") and _minted(headers) is None


def route_of(path: str, headers: Mapping[str, str], policy: RoutingPolicy,
             body: Mapping[str, Any] | None = None) -> Route | None:
    """The session a request belongs to (see the module's table); None: served where it lands.

    ``headers`` are the request's, names lower case (the first of a repeated name). ``body`` is the JSON
    object of a model call, needed only where ``wants_body`` says so (None: not read)."""
    rollout_id = rollout_in_path(path)
    if rollout_id is not None:
        return Route("rollout", route_tag(rollout_id))
    if path.startswith(SESSION_PATH) and path.endswith(SESSION_END) and len(path) > len(SESSION_PATH + SESSION_END):
        return Route("session", session_tag(path[len(SESSION_PATH):-len(SESSION_END)], policy.refs))
    rollout_id = headers.get("x-rollout-id")
    if rollout_id:
        return Route("rollout", route_tag(rollout_id))
    key = _minted(headers)
    if key is not None:
        # A minted key names its attempt; one without a tag (an older form, a forgery) is refused where it lands.
        tag = route_tag_of_key(key)
        return Route("api_key", tag) if tag is not None else None
    protocol = model_protocol(path)
    if protocol is None:
        return None
    if policy.organic_sessions:
        found = session_key(headers, body or {}, protocol, policy.session_key_sources, policy.admin_key)
        if found is not None:
            return Route("session", session_tag(found[0], policy.refs))
    session = session_id_of(headers)
    return Route("harness_session", session_tag(session, policy.refs)) if session is not None else None


def _minted(headers: Mapping[str, str]) -> str | None:
    key = presented_key(headers)
    return key if key is not None and key.startswith(API_KEY_PREFIX) else None


def header_map(raw: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
    """ASGI headers as a lower-case name -> value map (the first of a repeated name, as Starlette's ``get``)."""
    out: dict[str, str] = {}
    for name, value in raw:
        out.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return out


def mint_owned_rollout_id(process: int, processes: int) -> str:
    """A fresh rollout id that ``owner_of`` gives to ``process`` (about ``processes`` draws)."""
    while True:
        rollout_id = uuid.uuid4().hex
        if owner_of(rollout_id, processes) == process:
            return rollout_id

