"""Compaction: sealed write-ahead segments -> Parquet partitions of the lake, exactly once, then deleted.

Why it is safe to rerun at any point: rows are deduplicated by their idempotency key (event_id for
interactions, feedback_id for feedback) within the batch AND against the ids the target partition
already holds; the part file's name is derived from the segments it came from; segments are deleted
only after every partition file is durably written. A crash between the write and the delete therefore
leaves segments whose rows are all already in the lake, and the next pass writes nothing and deletes them.
One compactor at a time (flock on <wal>/.compact.lock), so the gateway's background pass and
`rtrl collect compact` never race.
Data rights: rows under a recorded `rtrl forget` request (forget/registry.json) are dropped here, with
the feedback of those interactions, so events still in flight when the request came never land.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from rl_core.collect import wal
from rl_core.forget import is_forgotten, load_registry
from rl_core.lake import Lake
from rl_core.schema import TS_COLUMN, to_table

ID_COLUMN = {"interactions": "event_id", "feedback": "feedback_id"}
TS_FIELDS = {"interactions": ("ts_request", "ts_response"), "feedback": ("ts",)}


@dataclass
class CompactResult:
    segments: int = 0
    orphans_sealed: int = 0
    rows_read: dict[str, int] = field(default_factory=lambda: {"interactions": 0, "feedback": 0})
    rows_written: dict[str, int] = field(default_factory=lambda: {"interactions": 0, "feedback": 0})
    duplicates: int = 0
    forgotten: int = 0  # rows dropped because a forget request covers them
    files: list[str] = field(default_factory=list)


def _row_from_json(kind: str, row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for name in TS_FIELDS[kind]:
        v = out.get(name)
        if isinstance(v, str):
            out[name] = datetime.fromisoformat(v)
    return out


def existing_ids(lake: Lake, partition: str, id_column: str) -> set[str]:
    ids: set[str] = set()
    for path in lake.list_files(partition):
        with lake.fs.open(path, "rb") as f:
            ids.update(pq.read_table(f, columns=[id_column]).column(id_column).to_pylist())
    return ids


class _DirLock:
    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def compact(wal_dir: str | Path, lake: Lake, max_segments: int = 64) -> CompactResult:
    """Compact every sealed segment (and orphaned .open ones of dead writers) into the lake."""
    wal_dir = Path(wal_dir)
    result = CompactResult()
    if not wal_dir.is_dir():
        return result
    with _DirLock(wal_dir / ".compact.lock"):
        for p in wal.open_segments(wal_dir):
            if wal.try_seal_orphan(p) is not None:
                result.orphans_sealed += 1
        segments = wal.sealed_segments(wal_dir)
        registry = load_registry(lake)
        for i in range(0, len(segments), max_segments):
            _compact_batch(segments[i:i + max_segments], lake, result, registry)
    return result


def _compact_batch(segments: list[Path], lake: Lake, result: CompactResult, registry: list[dict]) -> None:
    groups: dict[tuple[str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    rows_in = [(kind, _row_from_json(kind, raw)) for seg in segments for kind, raw in wal.read_segment(seg)
               if kind in ID_COLUMN]
    forgotten = {r["event_id"] for k, r in rows_in
                 if k == "interactions" and is_forgotten(registry, r.get("org_id"), r.get("user_id"))}
    for kind, row in rows_in:
        result.rows_read[kind] += 1
        if row.get("event_id") in forgotten or (kind == "feedback" and is_forgotten(registry, row.get("org_id"), None)):
            result.forgotten += 1
            continue
        part = Lake.partition(kind, row[TS_COLUMN[kind]])
        key = row[ID_COLUMN[kind]]
        if key in groups[(kind, part)]:
            result.duplicates += 1
            continue
        groups[(kind, part)][key] = row
    tag = hashlib.sha1("\n".join(s.name for s in segments).encode()).hexdigest()[:16]
    for (kind, part), rows in sorted(groups.items()):
        have = existing_ids(lake, part, ID_COLUMN[kind])
        fresh = [r for k, r in rows.items() if k not in have]
        result.duplicates += len(rows) - len(fresh)
        if not fresh:
            continue
        fresh.sort(key=lambda r: (r[TS_COLUMN[kind]], r[ID_COLUMN[kind]]))
        table = to_table(kind, fresh)
        result.files.append(lake.write_parquet(f"{part}/part-{tag}.parquet", table))
        result.rows_written[kind] += len(fresh)
    for seg in segments:  # only after every partition file is durable
        seg.unlink()
    if segments:
        fd = os.open(segments[0].parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    result.segments += len(segments)
