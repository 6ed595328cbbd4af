"""Which gateway process owns a request (sticky.py): every way a request can name one session gives one
owner, in the order the app resolves identities (identity.py, sessions.py), for any number of processes."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from producers.gateway.keys import derive_api_key, route_tag, route_tag_of_key
from producers.gateway.sessions import session_key
from producers.gateway.sticky import Route, RoutingPolicy, owner, owner_of, route_of, wants_body

ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,40}", fullmatch=True)
session_values = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=60)
processes = st.integers(min_value=1, max_value=16)
ORGANIC = RoutingPolicy(organic_sessions=True, session_key_sources=("headers", "openai.user",
                                                                     "anthropic.metadata.user_id", "api_key"))
CHAT, MESSAGES = "/v1/chat/completions", "/v1/messages"


def _owner(route: Route | None, n: int) -> int | None:
    return None if route is None else owner(route, n)


@given(ids, ids, processes)
def test_every_way_of_naming_an_attempt_has_one_owner(rollout_id: str, attempt_id: str, n: int) -> None:
    key = derive_api_key(b"s" * 32, rollout_id, attempt_id)
    assert route_tag_of_key(key) == route_tag(rollout_id)
    ways = [route_of(f"/rollouts/{rollout_id}/attempts/{attempt_id}{CHAT}", {}, ORGANIC),
            route_of(f"/rollouts/{rollout_id}/attempts/{attempt_id}{MESSAGES}", {"x-session-id": "other"}, ORGANIC),
            route_of(f"/v1/rollouts/{rollout_id}/attempts/{attempt_id}/finish", {}, ORGANIC),
            route_of(f"/v1/rollouts/{rollout_id}/attempts", {}, ORGANIC),
            route_of(CHAT, {"x-rollout-id": rollout_id, "x-session-id": "other"}, ORGANIC),
            route_of(CHAT, {"authorization": f"Bearer {key}", "x-session-id": "other"}, ORGANIC, {"user": "u"}),
            route_of(MESSAGES, {"x-api-key": key}, ORGANIC)]
    assert {_owner(r, n) for r in ways} == {owner_of(rollout_id, n)}
    assert {r.kind for r in ways if r is not None} == {"rollout", "api_key"}


@given(session_values, processes)
def test_an_organic_session_has_one_owner_whatever_names_it(value: str, n: int) -> None:
    """A key from a header, a body field or the API key, and the end route for that key, agree."""
    by_header = route_of(CHAT, {"x-session-id": value}, ORGANIC)
    by_claude_header = route_of(MESSAGES, {"x-claude-code-session-id": value}, ORGANIC)
    by_user = route_of(CHAT, {}, ORGANIC, {"user": value})
    by_metadata = route_of(MESSAGES, {}, ORGANIC, {"metadata": {"user_id": value}})
    by_count = route_of("/v1/messages/count_tokens", {}, ORGANIC, {"metadata": {"user_id": value}})
    by_end = route_of(f"/v1/sessions/{value}/end", {}, ORGANIC)
    routes = [by_header, by_claude_header, by_user, by_metadata, by_count, by_end]
    assert all(r is not None and r.kind == "session" for r in routes)
    assert len({_owner(r, n) for r in routes}) == 1
    # Organic sessions off: the unattributed pseudo-attempt of the harness session stays where it was.
    plain = route_of(CHAT, {"x-session-id": value}, RoutingPolicy())
    assert plain is not None and plain.kind == "harness_session" and plain.tag == by_header.tag  # type: ignore[union-attr]


@given(session_values, processes)
def test_a_tenant_api_key_session_is_routed_by_the_key_it_is_recorded_under(api_key: str, n: int) -> None:
    api_key = "sk-" + api_key  # never a minted key (tt-...)
    headers = {"authorization": f"Bearer {api_key}"}
    key, source = session_key(headers, {}, "openai", ORGANIC.session_key_sources)  # type: ignore[misc]
    assert source == "api_key" and key == "api-key:" + hashlib.sha256(api_key.encode()).hexdigest()[:24]
    calls = [route_of(CHAT, headers, ORGANIC, {}), route_of(MESSAGES, {"x-api-key": api_key}, ORGANIC, {}),
             route_of(f"/v1/sessions/{key}/end", {}, ORGANIC)]
    assert len({_owner(r, n) for r in calls}) == 1 and None not in calls


def test_the_order_of_sources_is_the_apps_and_nothing_else_is_routed() -> None:
    users_first = RoutingPolicy(True, ("openai.user", "headers"))
    by_user = route_of(CHAT, {"x-session-id": "h"}, users_first, {"user": "u"})
    assert by_user == route_of(CHAT, {}, ORGANIC, {"user": "u"}) != route_of(CHAT, {"x-session-id": "h"}, ORGANIC)
    # The admin key is nobody's session; an unknown or old-form tt- key is refused wherever it lands.
    admin = RoutingPolicy(True, ("api_key",), admin_key="adm")
    assert route_of(CHAT, {"authorization": "Bearer adm"}, admin) is None
    assert route_of(CHAT, {"authorization": "Bearer tt-forged"}, admin) is None
    assert route_of(CHAT, {"authorization": "Bearer tt-0123abcd.mac"}, admin) == Route("api_key", "0123abcd")
    # No session at all, or not a model call: served where it lands.
    for path in ("/health", "/v1/models", "/v1/feedback", "/v1/rollouts", CHAT):
        assert route_of(path, {}, ORGANIC, {}) is None
    assert route_of("/v1/models", {"x-session-id": "s"}, ORGANIC) is None
    # The body is read only for a model call that names no attempt, with a body field among the sources.
    assert wants_body(CHAT, {}, ORGANIC) and wants_body("/v1/messages/count_tokens", {}, ORGANIC)
    assert not wants_body(CHAT, {}, RoutingPolicy(True, ("headers", "api_key")))
    assert not wants_body(CHAT, {}, RoutingPolicy(False, ORGANIC.session_key_sources))
    assert not wants_body(CHAT, {"x-rollout-id": "r"}, ORGANIC)
    assert not wants_body("/rollouts/r/attempts/a/v1/chat/completions", {}, ORGANIC)
    assert not wants_body(CHAT, {"x-api-key": derive_api_key(b"k" * 32, "r", "a")}, ORGANIC)
    assert not wants_body("/v1/models", {}, ORGANIC)


def test_sessions_spread_over_the_processes() -> None:
    counts = [0, 0, 0]
    for n in range(3000):
        route = route_of(CHAT, {"x-session-id": f"session-{n}"}, ORGANIC)
        assert route is not None
        counts[owner(route, 3)] += 1
    assert min(counts) > 850, counts
