"""The residue matcher: finds planted canaries and token runs wherever they are readable, and nothing in
AES-GCM ciphertext or across the boundary of two arrays."""

from __future__ import annotations

import base64
import html
import json
import os
from pathlib import Path

import numpy as np
import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from transformers import AutoTokenizer

from schemas.codec import get_codec
from schemas.residue import Hit, Matcher, Needles, Tally, canary_token_run, record_decoder
from schemas.tokens import pack_ids
from tests.residue_data import CANARY, ODD_CANARY, RUN, call_record, encode, matcher


def needles_of(hits: list[Hit]) -> set[str]:
    return {h.needle for h in hits}


def test_a_canary_in_a_request_body_is_found_raw_and_decoded() -> None:
    body = json.dumps({"messages": [{"role": "user", "content": f"my secret is {CANARY}"}]})
    value = encode(call_record([1, 2, 3], [4, 5], request_json=body))
    m = matcher()
    assert needles_of(m.in_bytes(value, "value")) == {"canary[0]"}
    decoded = m.in_encoded(value, "decoded")
    assert {h.field for h in decoded} >= {"decoded.request_json"}
    assert needles_of(decoded) == {"canary[0]"}


@pytest.mark.parametrize("written", [
    json.dumps({"content": ODD_CANARY}),  # JSON escapes the quotes and the ë
    json.dumps({"content": ODD_CANARY}, ensure_ascii=False),
    f"<td>{html.escape(ODD_CANARY)}</td>",  # the report escapes text
])
def test_a_canary_is_found_in_each_form_a_store_writes_it(written: str) -> None:
    assert ODD_CANARY not in written  # only an escaped form is there
    m = matcher(ODD_CANARY)
    assert needles_of(m.in_bytes(written.encode(), "file")) == {"canary[0]"}
    assert needles_of(m.in_value(written, "text")) == {"canary[0]"}


def test_content_under_aes_gcm_is_not_readable_and_decrypted_it_is() -> None:
    """Crypto-shredding: the same plaintext is found in the clear and not at all as ciphertext."""
    plaintext = encode(call_record([9, *RUN, 9], [4, 5], request_json=json.dumps({"content": CANARY})))
    key, nonce = AESGCM.generate_key(bit_length=256), os.urandom(12)
    sealed = nonce + AESGCM(key).encrypt(nonce, plaintext, b"subject-1")
    m = matcher()
    assert needles_of(m.in_bytes(plaintext, "value") + m.in_encoded(plaintext, "decoded")) == {"canary[0]", "tokens[0]"}
    assert m.in_bytes(sealed, "value") == []
    assert m.in_encoded(sealed, "decoded") == []
    assert m.in_value({"request_json": base64.b64encode(sealed).decode(), "sealed": sealed}, "") == []
    opened = AESGCM(key).decrypt(sealed[:12], sealed[12:], b"subject-1")  # the key, while it exists, reads it
    assert needles_of(m.in_encoded(opened, "decoded")) == {"canary[0]", "tokens[0]"}


def test_sealed_content_is_readable_while_any_key_opens_it_and_not_once_the_key_is_destroyed() -> None:
    """With an unsealer over the keys that are left, the scan shows what the master-key holder could still
    read: a key that forgetting failed to destroy is caught, a destroyed one leaves nothing."""
    keys = {b"key-0001": AESGCM.generate_key(bit_length=256)}

    def seal(key_id: bytes, plaintext: bytes) -> bytes:
        nonce = os.urandom(12)
        return key_id + nonce + AESGCM(keys[key_id]).encrypt(nonce, plaintext, key_id)

    def unseal(blob: bytes) -> bytes | None:
        key = keys.get(blob[:8])
        if key is None or len(blob) < 8 + 12 + 16:
            return None
        try:
            return AESGCM(key).decrypt(blob[8:20], blob[20:], blob[:8])
        except InvalidTag:
            return None

    envelope = seal(b"key-0001", json.dumps({"content": CANARY, "prompt": [1, *RUN]}).encode())
    m = Matcher(Needles((CANARY,), (RUN,)), record_decoder(get_codec()), unseal)
    record = {"request_json": "", "sealed": envelope}  # content fields blank, the content sealed beside them
    assert needles_of(m.in_value(record, "")) == {"canary[0]", "tokens[0]"}
    assert needles_of(m.in_encoded(envelope, "value")) == {"canary[0]", "tokens[0]"}
    del keys[b"key-0001"]  # the forget: the key is destroyed
    assert m.in_value(record, "") == []
    assert m.in_encoded(envelope, "value") == []


def test_a_token_run_is_found_in_a_packed_array_a_list_and_json() -> None:
    m = matcher()
    value = encode(call_record([7, 8, *RUN, 8], [4, 5]))
    assert needles_of(m.in_bytes(value, "value")) == {"tokens[0]"}
    assert {h.field for h in m.in_encoded(value, "decoded")} == {"decoded.prompt.ids"}
    assert needles_of(m.in_value([1, *RUN, 2], "prompt_ids_arr")) == {"tokens[0]"}  # a ClickHouse Array(UInt32)
    assert needles_of(m.in_value(np.asarray([*RUN, 3], dtype=np.uint32), "arr")) == {"tokens[0]"}
    body = json.dumps({"model": "m", "prompt": [5, *RUN]})  # a completions request with a token-id prompt
    hits = m.in_value(body, "request_json")
    assert needles_of(hits) == {"tokens[0]"}
    assert needles_of(m.in_bytes(b"ids: [" + ", ".join(map(str, RUN)).encode() + b"]", "log")) == {"tokens[0]"}


def test_a_run_across_the_boundary_of_two_arrays_is_not_a_false_positive() -> None:
    m = matcher()
    split = encode(call_record([7, 8, *RUN[:2]], [*RUN[2:], 9]))  # prompt ends, output begins the run
    assert m.in_bytes(split, "value") == []
    assert m.in_encoded(split, "decoded") == []
    assert m.in_value({"prompt_ids_arr": [1, *RUN[:3]], "output_ids_arr": [*RUN[3:], 2]}, "") == []
    assert m.in_value([[1, *RUN[:3]], [*RUN[3:], 2]], "rows") == []  # an Array(Array(UInt32))
    # the run's bytes off an element boundary (two bytes in) are not the run
    shifted = b"\x00\x00" + pack_ids(RUN) + b"\x00\x00"
    assert m.in_packed(shifted, "ids") == []
    assert m.in_packed(pack_ids([3, *RUN]), "ids") == [Hit("ids", "tokens[0]")]
    # written lists: not a part of a longer number
    assert m.in_bytes(b"[170011, 70012, 70013, 70014, 700155]", "log") == []


def test_needles_refuse_what_would_match_by_chance() -> None:
    with pytest.raises(ValueError, match="fewer than 4"):
        Needles((), ((1, 2, 3),))
    with pytest.raises(ValueError, match="zero-filled"):
        Needles((), ((0, 0, 0, 0, 0),))  # what a blanked token array holds
    with pytest.raises(ValueError, match="nothing to look for"):
        Needles()
    with pytest.raises(ValueError, match="at least 4"):
        Needles(("abc",))
    assert Needles.from_json(Needles((CANARY,), (RUN,)).to_json()) == Needles((CANARY,), (RUN,))


def test_the_tally_counts_locations_once_with_every_needle() -> None:
    tally = Tally()
    assert tally.add("kafka", "t[0]@1", [Hit("value", "canary[0]"), Hit("decoded.x", "canary[0]"),
                                         Hit("value", "canary[0]"), Hit("value", "tokens[0]")])
    assert not tally.add("kafka", "t[0]@2", [])
    tally.add("clickhouse", "db.calls event_id=e", [Hit("request_json", "canary[0]")])
    tally.count("kafka_records", 2)
    summary = tally.summary()
    assert summary["residual_readable"] == 2
    assert summary["by_store"] == {"clickhouse": 1, "kafka": 1}
    assert summary["by_needle"] == {"canary[0]": 2, "tokens[0]": 1}
    assert summary["locations"][0] == {"store": "kafka", "where": "t[0]@1", "needles": ["canary[0]", "tokens[0]"],
                                       "fields": ["decoded.x", "value"]}
    assert summary["complete"] is True
    tally.incomplete.append("kafka t[1]: not read to its end")
    assert tally.summary()["complete"] is False


def test_a_canary_s_token_run_is_found_in_a_prompt_the_real_tokenizer_made(model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    run = canary_token_run(encode, CANARY)
    m = Matcher(Needles((), (run,)))
    for text in (f"my key is {CANARY}, ok?", f'{{"k": "{CANARY}"}}', f"{CANARY}\n{CANARY}"):
        prompt = encode(text)
        assert m.in_packed(pack_ids(prompt), "ids") == [Hit("ids", "tokens[0]")], text
    assert m.in_packed(pack_ids(encode("my key is canary-7f3b9c-zebra")), "ids") == []
    with pytest.raises(ValueError, match="use a longer one"):
        canary_token_run(encode, "ab")
