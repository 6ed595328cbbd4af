"""The residue scan of a real spool directory: records frame by frame, a torn tail, quarantined records,
read while the spool is open (locked) by its owner; nothing found in AES-GCM ciphertext."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from producers.delivery.quarantine import Quarantine
from producers.delivery.residue import scan_spool
from producers.delivery.spool import SEGMENT_SUFFIX, Spool, encode_frame
from schemas.residue import Tally
from tests.residue_data import CANARY, RUN, call_record, encode, matcher


def test_spooled_records_with_content_are_found_and_ciphertext_is_not(tmp_path: Path) -> None:
    spool_dir = tmp_path / "spool" / "worker-0"
    key, nonce = AESGCM.generate_key(bit_length=256), os.urandom(12)
    sealed = nonce + AESGCM(key).encrypt(nonce, encode(call_record([1, *RUN], [2], json.dumps([CANARY]))), None)
    with Spool(spool_dir, segment_bytes=1024) as spool:  # held open (and locked) while the scan reads it
        spool.append_batch([
            ("tokentrail.calls", b"r-0", encode(call_record([5], [6], json.dumps({"content": CANARY})))),
            ("tokentrail.calls", b"r-1", sealed),
            ("tokentrail.calls", b"r-2", encode(call_record([5, *RUN], [6]))),
            ("tokentrail.calls", b"r-3", encode(call_record([5, *RUN[:2]], [*RUN[2:]]))),
        ])
        segments = sorted(spool_dir.glob(f"*{SEGMENT_SUFFIX}"))
        with open(segments[-1], "ab") as f:  # a torn frame at the end, as a crash mid-append leaves it
            f.write(encode_frame(99, "tokentrail.calls", b"r-9", f"x {CANARY} y".encode() * 4)[:-5])
        Quarantine(tmp_path / "spool" / "worker-0" / "quarantine").put(
            "tokentrail.calls", b"r-q", encode(call_record([5], [6], json.dumps({"c": CANARY}))), "too large")

        tally = Tally()
        lines: list[str] = []
        scan_spool([tmp_path / "spool", tmp_path / "no-such-spool"], matcher(), tally, progress=lines.append)

    found = {loc.where: {h.needle for h in loc.hits} for loc in tally.locations}
    seq_hits = {w.rsplit("#", 1)[1]: n for w, n in found.items() if "#" in w}
    assert seq_hits == {"0": {"canary[0]"}, "2": {"tokens[0]"}}  # not 1 (sealed), not 3 (the run split in two)
    tails = [n for w, n in found.items() if SEGMENT_SUFFIX + "@" in w]
    assert tails == [{"canary[0]"}]
    quarantined = {Path(w).suffix: n for w, n in found.items() if "quarantine" in w}
    assert quarantined == {".avro": {"canary[0]"}}  # the note beside it holds no content
    assert tally.scanned["spool_records"] == 4
    assert tally.skipped == [f"spool {tmp_path / 'no-such-spool'} (does not exist)"]
    assert tally.residual_readable == 4
    assert lines and "files" in lines[0]
