"""The attempt-key secret file (issue 29, finding 8): an empty or short file would make the HMAC key empty, so
every attempt key could be computed from its ids. The gateway refuses to start on it, naming the file; a good
gateway before and one started after the file is fixed still record their calls on Kafka."""

from __future__ import annotations

from pathlib import Path

import pytest

from producers.gateway.keys import MIN_SECRET_BYTES, SECRET_FILE_NAME, KeySecretError, derive_api_key
from producers.sdk import Rollout

from .conftest import GatewayFactory
from .helpers import read_records

MODEL = "tokentrail-tiny"
USER = [{"role": "user", "content": "hi"}]


def _one_call(start_gateway: GatewayFactory, secret_dir: Path) -> str:
    with start_gateway(key_secret_dir=secret_dir) as gw, Rollout(gw.url) as rollout:
        # the key is the HMAC of a real secret, not of an empty one
        assert rollout.api_key != derive_api_key(b"", rollout.rollout_id, rollout.attempt_id)
        rollout.openai_client(max_retries=0).chat.completions.create(model=MODEL, messages=USER, max_tokens=2)
        return rollout.rollout_id


def test_an_empty_or_short_secret_file_stops_the_gateway(start_gateway: GatewayFactory, topics: dict[str, str],
                                                         tokentrail_settings, tmp_path: Path) -> None:
    secrets_dir = tmp_path / "secrets"
    before = _one_call(start_gateway, secrets_dir)  # writes a good random secret
    good = (secrets_dir / SECRET_FILE_NAME).read_text()
    assert len(bytes.fromhex(good)) >= MIN_SECRET_BYTES
    for bad in ("", "\n", "ab" * (MIN_SECRET_BYTES - 1), "not hex at all, but long enough to pass a length check"):
        (secrets_dir / SECRET_FILE_NAME).write_text(bad)
        refused = pytest.raises(KeySecretError, match=f"secret file {secrets_dir / SECRET_FILE_NAME}.*computable")
        with refused, start_gateway(key_secret_dir=secrets_dir):
            pass
    (secrets_dir / SECRET_FILE_NAME).write_text(good)  # the operator restores it: keys of before still match
    after = _one_call(start_gateway, secrets_dir)
    for rollout_id in (before, after):
        read_records(tokentrail_settings, topics["calls_topic"], 1, where={"rollout_id": rollout_id})
