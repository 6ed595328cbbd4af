"""Sealing is on by default with a public development master key: a process that uses it outside the test
suite says so loudly, once (schemas/kafka/key_store.py)."""

from __future__ import annotations

import pytest

from schemas.kafka import key_store
from schemas.kafka.key_store import ForgetSettings, warn_dev_master_key


def test_the_dev_master_key_warns_once_outside_the_tests(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(key_store, "_dev_key_warned", [False])
    warn_dev_master_key()  # under pytest: quiet
    assert capsys.readouterr().err == ""
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    warn_dev_master_key()
    warn_dev_master_key()
    err = capsys.readouterr().err
    assert err.count("DEV-ONLY master key") == 1 and "TOKENTRAIL_FORGET__MASTER_KEY" in err


def test_sealing_is_on_by_default_and_an_operators_key_is_not_the_dev_one() -> None:
    assert ForgetSettings().enabled and ForgetSettings().uses_dev_master_key()
    assert not ForgetSettings(master_key="ab" * 32).uses_dev_master_key()
