"""Call refs (issue 29, tenant feedback on any gateway process): a tenant's response ids carry its call id and a
keyed tenant tag; the feedback's call id is the part before the tag, and only the tenant's tag passes."""

from __future__ import annotations

from producers.gateway.session_refs import SessionRefs
from schemas.feedback import FeedbackValue, build_feedback, call_id_of_response, split_call_ref

CALL = "0123456789abcdef0123456789abcdef"


def _feedback(kind: str, target: str) -> dict:
    return build_feedback(source="s", target_kind=kind, target_id=target, kind="BINARY",
                          value=FeedbackValue(binary=True), event_time_us=1, created_at_us=1)


def test_a_call_ref_names_its_call_and_only_its_tenant_owns_it() -> None:
    refs = SessionRefs("a-secret")
    ref = refs.call_ref(CALL, "acme")
    assert split_call_ref(ref) == (CALL, ref.split(".")[1]) and split_call_ref(CALL) == (CALL, None)
    assert refs.call_owned_by(ref, "acme") and not refs.call_owned_by(ref, "blue")
    assert not refs.call_owned_by(CALL, "acme") and not SessionRefs("other").call_owned_by(ref, "acme")
    assert not refs.call_owned_by(f"{CALL}.{'0' * 16}", "acme")
    # The join's call id is the call's, whether the feedback names the ref, the response, or the bare id.
    assert call_id_of_response(f"chatcmpl-{ref}") == call_id_of_response(f"msg_{CALL}") == CALL
    for kind, target in (("CALL", ref), ("CALL", CALL), ("RESPONSE", f"resp_{ref}"), ("RESPONSE", f"cmpl-{CALL}")):
        record = _feedback(kind, target)
        assert record["call_id"] == CALL and record["target_id"] == target
