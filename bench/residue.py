"""Residue-scan benchmark: how fast `tokentrail scan-residue` searches stored records for forgotten content.

Records: synthetic groups as the gateway and the processors write them (chat request bodies, 512-token
prompts; every event type of a rollout). Baseline, same process: decoding every record with the codec and
nothing else (what any reader of the topics pays). Figures: records and MB per second for the raw-bytes
search, for decode + the walk of the decoded record, and their cost over decoding alone.
"""

from __future__ import annotations

from bench.common import best_time, emit
from schemas.codec import get_codec
from schemas.residue import Matcher, Needles, record_decoder
from testkit.storage_records import GroupSpec, synthetic_group

GROUPS = 20


def main() -> None:
    codec = get_codec()
    values = [codec.encode(name, record) for g in range(GROUPS)
              for name, record in synthetic_group(GroupSpec(group_index=g, seed=g, bodies="chat",
                                                            prompt_tokens=512)).events]
    megabytes = sum(map(len, values)) / 1e6
    # Needles that are not there (the common case after a forget): every record is searched to its end.
    matcher = Matcher(Needles(("canary-7f3a9c-zebra", "Zoë-canary-2", "third canary string"),
                              ((900001, 900002, 900003, 900004), (31000, 31001, 31002, 31003, 31004))),
                      record_decoder(codec))

    def decode_only() -> None:
        for value in values:
            codec.decode(value)

    def raw() -> None:
        for value in values:
            matcher.in_bytes(value, "value")

    def decoded() -> None:
        for value in values:
            matcher.in_encoded(value, "decoded")

    decode_s = best_time(decode_only, repeat=3)
    raw_s = best_time(raw, repeat=3)
    decoded_s = best_time(decoded, repeat=3)
    n = len(values)
    emit({
        "records": n, "megabytes": round(megabytes, 2),
        "decode_only_records_per_s": round(n / decode_s), "raw_records_per_s": round(n / raw_s),
        "raw_mb_per_s": round(megabytes / raw_s, 1), "decoded_walk_records_per_s": round(n / decoded_s),
        "scan_records_per_s": round(n / (raw_s + decoded_s)),
        "scan_over_decode_only": round((raw_s + decoded_s) / decode_s, 2),
    })


if __name__ == "__main__":
    main()
