"""Vectorised Arrow columns for the generators: one numpy draw per column, never a Python loop per row.

Both event generators (synth, ab_synth) build their tables from these pieces, which is why a million rows take
seconds, and both write the way the collector lays out the lake: one file per hour partition, rows in time order.
"""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pyarrow as pa

from rl_core.duck import write_table
from rl_core.lake import Lake
from rl_core.schema import TS

US = 1_000_000  # timestamps are int64 epoch microseconds until they become columns
HOUR = 3600 * US


def uuids(rng: np.random.Generator, n: int, *, variant_draw: bool = False) -> pa.Array:
    """n random UUID4 strings built as one byte buffer. The variant nibble comes from the random bytes, or, with
    variant_draw, from one more draw: how ab_synth has always drawn it, kept so its seeded logs stay the same."""
    b = rng.integers(0, 256, (n, 16), dtype=np.uint8)
    b[:, 6] = (b[:, 6] & 0x0F) | 0x40
    variant = rng.integers(0, 4, n).astype(np.uint8) if variant_draw else (b[:, 8] >> 4) & 3
    b[:, 8] = (b[:, 8] & 0x0F) | ((8 | variant) << 4)
    lut = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    h = np.empty((n, 32), dtype=np.uint8)
    h[:, 0::2], h[:, 1::2] = lut[b >> 4], lut[b & 15]
    out = np.full((n, 36), ord("-"), dtype=np.uint8)
    for src, dst in ((slice(0, 8), slice(0, 8)), (slice(8, 12), slice(9, 13)), (slice(12, 16), slice(14, 18)),
                     (slice(16, 20), slice(19, 23)), (slice(20, 32), slice(24, 36))):
        out[:, dst] = h[:, src]
    offsets = np.arange(0, 36 * n + 1, 36, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(out.tobytes()))


def timestamps(us: np.ndarray) -> pa.Array:
    """Epoch microseconds -> the contract's UTC timestamp column."""
    return pa.array(np.asarray(us, dtype=np.int64), pa.int64()).cast(TS)


def const(value, n: int, type_: pa.DataType | None = None) -> pa.Array:
    return pa.array([value], type=type_).take(pa.array(np.zeros(n, dtype=np.int64)))


def pick(pool, idx: np.ndarray) -> pa.Array:
    """pool[idx] as a string column."""
    return pa.array(pool, pa.string()).take(pa.array(idx))


def lists(lengths: np.ndarray, values: pa.Array) -> pa.Array:
    """A list column whose row i holds the next lengths[i] of values."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def write_to_lake(lake: Lake, table_name: str, table: pa.Table, tag: str = "synth") -> list[str]:
    """Write rows into their raw hour partitions: one file per hour named <tag>.parquet, rows in time order.
    Names are deterministic, so writing the same rows with the same tag again overwrites instead of adding."""
    if not table.num_rows:
        return []
    ts_us = table["ts_request" if table_name == "interactions" else "ts"].cast(pa.int64()).to_numpy()
    if len(ts_us) > 1 and not np.all(ts_us[1:] >= ts_us[:-1]):
        order = np.argsort(ts_us, kind="stable")
        table, ts_us = table.take(pa.array(order)), ts_us[order]
    hours = ts_us // HOUR
    bounds = np.flatnonzero(np.diff(hours)) + 1
    files = []
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(hours)], strict=True):
        h = datetime.fromtimestamp(int(hours[lo]) * 3600, tz=timezone.utc)
        files.append(write_table(lake, f"{lake.partition(table_name, h)}/{tag}.parquet", table.slice(lo, hi - lo)))
    return files
