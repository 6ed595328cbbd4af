"""Stored subjects are keyed pseudonyms of the names (schemas/subject_names.py): the tenant part stays
readable (retention and tenancy read it), the rest says nothing without the secret."""

from __future__ import annotations

import pytest

from schemas.kafka.key_store import ForgetSettings
from schemas.subject_names import SUBJECT_MARK, SubjectNames, readable_prefix

NAMES = SubjectNames(b"\x01" * 32)


@pytest.mark.parametrize(("name", "prefix"), [
    ("user-17", ""), ("acme/user-17", "acme/"), ("tenant:acme:user-17", "tenant:acme:"),
    ("tenant:acme:eu/user-17", "tenant:acme:eu/"), ("tenant:", ""), ("a/bob/carol", "a/"),
])
def test_the_tenant_part_stays_readable_and_the_rest_is_hashed(name: str, prefix: str) -> None:
    stored = NAMES.stored(name)
    assert readable_prefix(name) == prefix and stored.startswith(prefix + SUBJECT_MARK)
    assert len(stored) == len(prefix) + len(SUBJECT_MARK) + 32 and name[len(prefix):] not in stored


def test_deterministic_keyed_and_distinct() -> None:
    assert NAMES.stored("acme/u1") == SubjectNames(b"\x01" * 32).stored("acme/u1")  # every process agrees
    assert NAMES.stored("acme/u1") != SubjectNames(b"\x02" * 32).stored("acme/u1")  # not without the secret
    assert NAMES.stored("acme/u1") != NAMES.stored("acme/u2") != NAMES.stored("other/u1")
    # The retention tenant of a stored subject is the name's (ForgetSettings reads the part before '/').
    days = ForgetSettings(tenant_retention_days={"acme": 7.0})
    assert days.retention_days(NAMES.stored("acme/u1")) == 7.0


def test_forms_cover_records_written_with_the_name_or_read_as_a_pseudonym() -> None:
    stored = NAMES.stored("acme/u1")
    assert NAMES.forms("acme/u1") == (stored, "acme/u1")
    assert NAMES.forms(stored)[1] == stored  # a pseudonym copied from ClickHouse is forgotten as itself
    with pytest.raises(ValueError):
        SubjectNames(b"")
