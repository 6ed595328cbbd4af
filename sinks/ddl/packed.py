"""Calls' packed token bytes in, typed arrays stored: the mapping between the Avro bytes fields and the
calls table's columns, and the SQL that reads the exact bytes back."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StoredColumn:
    """A stored column derived from a packed input: its empty default and its default from the bytes."""

    name: str
    type: str
    codec: str
    empty: str
    expr: str

    def spec(self, default: str) -> str:
        codec = f" CODEC({self.codec})" if self.codec else ""
        return f"{self.name} {self.type} DEFAULT {default}{codec}"


@dataclass(frozen=True)
class PackedColumn:
    """An Avro bytes field of packed little-endian 4-byte values (token ids or logprobs).

    ``name`` is an EPHEMERAL input taking the bytes; stored are ``{name}_arr`` (the values), ``{name}_odd``
    (the bytes verbatim when their length is not a multiple of 4, so even a malformed record stays
    exact; normally empty) and, for nullable fields, ``{name}_null``.
    """

    name: str
    element: str  # UInt32 | Float32
    codec: str
    nullable: bool = False

    @property
    def input_type(self) -> str:
        return "Nullable(String)" if self.nullable else "String"

    def _bytes(self) -> str:
        return f"ifNull({self.name}, '')" if self.nullable else self.name

    def stored(self) -> list[StoredColumn]:
        raw = self._bytes()
        whole = f"length({raw}) % 4 = 0"
        out = [
            StoredColumn(
                f"{self.name}_arr",
                f"Array({self.element})",
                self.codec,
                "[]",
                f"reinterpret(if({whole}, {raw}, ''), 'Array({self.element})')",
            ),
            StoredColumn(f"{self.name}_odd", "String", "ZSTD(3)", "''", f"if({whole}, '', {raw})"),
        ]
        if self.nullable:
            out.append(StoredColumn(f"{self.name}_null", "Bool", "", "false", f"isNull({self.name})"))
        return out


# T64 crops each 64-value block to the bits it uses (token ids need ~15-18 of 32) and ZSTD codes the
# rest; Delta would not help (ids are not monotonic). Logprobs have no integer structure: ZSTD only.
ID_CODEC = "T64, ZSTD(3)"
CALL_PACKED: tuple[PackedColumn, ...] = (
    PackedColumn("prompt_ids", "UInt32", ID_CODEC, nullable=True),
    PackedColumn("prompt_new_ids", "UInt32", ID_CODEC, nullable=True),
    PackedColumn("output_ids", "UInt32", ID_CODEC),
    PackedColumn("output_logprobs", "Float32", "ZSTD(3)"),
)
CALL_STORED: tuple[StoredColumn, ...] = tuple(s for p in CALL_PACKED for s in p.stored())
CALL_STORED_TOKEN_COLUMNS: tuple[str, ...] = tuple(s.name for s in CALL_STORED)


def packed_read_sql(name: str) -> str:
    """SQL giving the exact Avro bytes of a packed calls column (NULL where the record had null)."""
    col = next(p for p in CALL_PACKED if p.name == name)
    value = f"if({name}_odd != '', {name}_odd, reinterpretAsString({name}_arr))"
    return f"if({name}_null, NULL, {value})" if col.nullable else value


def star_columns(table: str) -> str:
    """What ``SELECT *`` means for a table's rows: the calls table's token bytes rebuilt, not its arrays."""
    if table != "calls":
        return "*"
    rebuilt = ", ".join(f"{packed_read_sql(p.name)} AS {p.name}" for p in CALL_PACKED)
    return f"* EXCEPT ({', '.join(CALL_STORED_TOKEN_COLUMNS)}), {rebuilt}"
