"""Packed token arrays: ids as little-endian uint32, logprobs/weights as little-endian float32.

Decoding returns zero-copy numpy views over the Avro ``bytes`` field, so Python never walks a list
of a hundred thousand ints.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

IDS_DTYPE = np.dtype("<u4")
FLOAT_DTYPE = np.dtype("<f4")
INT32_DTYPE = np.dtype("<i4")
MASK_DTYPE = np.dtype("u1")

IdArray = npt.NDArray[np.uint32]
FloatArray = npt.NDArray[np.float32]


TokenIds = Sequence[int] | IdArray  # a prompt or output as a list of ints or a uint32 array

NO_IDS: IdArray = np.zeros(0, dtype=IDS_DTYPE)  # shared, never written: read-only
NO_IDS.flags.writeable = False


def int_list(ids: TokenIds) -> list[int]:
    """Plain Python ints (for JSON and for comparisons), whichever form the ids come in."""
    return ids.tolist() if isinstance(ids, np.ndarray) else [int(i) for i in ids]


def pack_ids(ids: Sequence[int] | npt.NDArray[np.integer]) -> bytes:
    arr = np.asarray(ids)
    if arr.dtype == IDS_DTYPE:
        return arr.tobytes()
    if arr.size and (arr.min() < 0 or arr.max() > 0xFFFFFFFF):
        raise ValueError("token ids must fit in uint32")
    return arr.astype(IDS_DTYPE, copy=False).tobytes()


def unpack_ids(data: bytes | memoryview) -> IdArray:
    if len(data) % 4:
        raise ValueError(f"packed id array has {len(data)} bytes, not a multiple of 4")
    return np.frombuffer(data, dtype=IDS_DTYPE)


def pack_floats(values: Sequence[float] | npt.NDArray[np.floating]) -> bytes:
    return np.asarray(values, dtype=FLOAT_DTYPE).tobytes()


def unpack_floats(data: bytes | memoryview) -> FloatArray:
    if len(data) % 4:
        raise ValueError(f"packed float array has {len(data)} bytes, not a multiple of 4")
    return np.frombuffer(data, dtype=FLOAT_DTYPE)


def pack_int32(values: Sequence[int] | npt.NDArray[np.integer]) -> bytes:
    return np.asarray(values, dtype=INT32_DTYPE).tobytes()


def unpack_int32(data: bytes | memoryview) -> npt.NDArray[np.int32]:
    return np.frombuffer(data, dtype=INT32_DTYPE)


def pack_mask(mask: Sequence[int] | npt.NDArray[np.integer] | npt.NDArray[np.bool_]) -> bytes:
    return np.asarray(mask, dtype=MASK_DTYPE).tobytes()


def unpack_mask(data: bytes | memoryview) -> npt.NDArray[np.uint8]:
    return np.frombuffer(data, dtype=MASK_DTYPE)
