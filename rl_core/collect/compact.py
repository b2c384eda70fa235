"""Compaction: sealed write-ahead segments -> Parquet partitions of the lake, exactly once, then deleted.

Why it is safe to rerun at any point: rows are deduplicated by their idempotency key (event_id for
interactions, feedback_id for feedback) within the batch AND against the ids the target partition
already holds; the part file's name is derived from the segments it came from; segments are deleted
only after every partition file is durably written. A crash between the write and the delete therefore
leaves segments whose rows are all already in the lake, and the next pass writes nothing and deletes them.
One compactor per WAL at a time (flock on <wal>/.compact.lock), so the gateway's background pass and
`rtrl collect compact` never race; and the whole pass holds the lake lock (rl_core.collect.locks), shared
with `rtrl forget`, so a forget never runs while this pass holds rows read but not yet written.
A row that cannot be written (a value its Parquet type cannot hold, a missing field, not an object, logprobs
that break the contract's rule, rl_core.schema.logprob_problem) goes to quarantine/ with its reason
(rl_core.collect.quarantine) and the rest of the pass lands: each partition is converted in one piece, and
only when that fails is it bisected until every bad row is alone.
Data rights: pending forget requests are resumed first; rows under a recorded request (forget/registry.json)
are dropped here, with the feedback of those interactions (forget/tombstones.json, which this pass extends
with the ids it drops), so events still in flight when the request came never land.
"""

from __future__ import annotations

import hashlib
import os
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rl_core.collect import quarantine, wal
from rl_core.collect.locks import FileLock, lake_lock
from rl_core.collect.quarantine import MAX_REASON, Bad, reason_of
from rl_core.forget import ForgetRules, add_tombstones_locked, load_registry, load_tombstones, resume_pending_locked
from rl_core.lake import Lake
from rl_core.schema import SCHEMAS, TS_COLUMN, check_logprobs, to_table

ID_COLUMN = {"interactions": "event_id", "feedback": "feedback_id"}
TS_FIELDS = {"interactions": ("ts_request", "ts_response"), "feedback": ("ts",)}
STRING_KEYS = ("event_id", "org_id")  # both tables: the index, dedupe and forget need them as text
# what a row that does not fit its table raises: while preparing it (a missing field, a timestamp that is
# not one, a row that is not an object) and while converting it (a value its Parquet type cannot hold)
PREPARE_ERRORS = (KeyError, TypeError, ValueError, AttributeError, OverflowError)
CONVERT_ERRORS = (pa.ArrowException, ValueError, TypeError, OverflowError)


def _counts() -> dict[str, int]:
    return {"interactions": 0, "feedback": 0}


@dataclass
class CompactResult:
    segments: int = 0
    orphans_sealed: int = 0
    rows_read: dict[str, int] = field(default_factory=_counts)
    rows_written: dict[str, int] = field(default_factory=_counts)
    duplicates: int = 0
    forgotten: int = 0  # rows dropped because a forget request covers them
    quarantined: dict[str, int] = field(default_factory=_counts)  # rows sent to quarantine/ by this pass
    last_error: str | None = None  # "<table>: <reason>" of the last row this pass quarantined
    forgets_resumed: int = 0  # forget requests a crash had left pending, finished by this pass
    files: list[str] = field(default_factory=list)
    quarantine_files: list[str] = field(default_factory=list)


@dataclass
class _Row:
    kind: str
    row: dict[str, Any]  # timestamps parsed
    part: str  # raw/<table>/date=.../hour=...
    key: str  # the idempotency key
    raw: Any  # as read from the WAL (what quarantine keeps)
    segment: str


def _row_from_json(kind: str, row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for name in TS_FIELDS[kind]:
        v = out.get(name)
        if isinstance(v, str):
            v = datetime.fromisoformat(v)
        if isinstance(v, datetime) and v.tzinfo is None:
            v = v.replace(tzinfo=timezone.utc)  # as Arrow reads a naive time into a UTC column
        out[name] = v
    return out


def _prepare(kind: str, raw: Any, segment: str) -> _Row:
    """Parse one WAL row enough to route it; raises one of PREPARE_ERRORS if it cannot be routed."""
    if not isinstance(raw, dict):
        raise TypeError(f"a {kind} row must be a JSON object, got {type(raw).__name__}")
    row = _row_from_json(kind, raw)
    for name in {ID_COLUMN[kind], *STRING_KEYS}:
        if not isinstance(row.get(name), str):
            raise TypeError(f"{name} must be a string, got {type(row.get(name)).__name__}")
    lps, tokens = row.get("completion_logprobs"), row.get("completion_token_ids")
    if kind == "interactions" and isinstance(lps, list) and isinstance(tokens, list):
        # float32 holds NaN, +inf and 0.5, so Arrow would take them; the contract's one logprob rule does not
        # (a row written past the gateway's models, or by an older gateway): quarantined, not landed
        check_logprobs("completion_logprobs", lps, len(tokens))
    return _Row(kind, row, Lake.partition(kind, row[TS_COLUMN[kind]]), row[ID_COLUMN[kind]], raw, segment)


def existing_ids(lake: Lake, partition: str, id_column: str) -> set[str]:
    ids: set[str] = set()
    for path in lake.list_files(partition):
        with lake.fs.open(path, "rb") as f:
            ids.update(pq.read_table(f, columns=[id_column]).column(id_column).to_pylist())
    return ids


def compact(wal_dir: str | Path, lake: Lake, max_segments: int = 64) -> CompactResult:
    """Compact every sealed segment (and orphaned .open ones of dead writers) into the lake."""
    wal_dir = Path(wal_dir)
    result = CompactResult()
    if not wal_dir.is_dir():
        return result
    with FileLock(wal_dir / ".compact.lock"), lake_lock(lake):  # always in this order (forget: lake only)
        for p in wal.open_segments(wal_dir):
            if wal.try_seal_orphan(p) is not None:
                result.orphans_sealed += 1
        result.forgets_resumed = len(resume_pending_locked(lake, wal_dir))
        segments = wal.sealed_segments(wal_dir)
        rules, tombstones = ForgetRules(load_registry(lake)), load_tombstones(lake)
        for i in range(0, len(segments), max_segments):
            _compact_batch(segments[i:i + max_segments], lake, result, rules, tombstones)
    return result


def _compact_batch(segments: list[Path], lake: Lake, result: CompactResult, rules: ForgetRules,
                   tombstones: set[str]) -> None:
    rows, bad = _read(segments, result)
    rows, bad, dropped = _drop_forgotten(rows, bad, rules, tombstones, result)
    tag = hashlib.sha1("\n".join(s.name for s in segments).encode()).hexdigest()[:16]
    bad += _write_groups(_group(rows, result), lake, result, tag)
    if bad:
        result.quarantine_files += quarantine.write(lake, bad, tag)
        for b in bad:
            result.quarantined[b.table] += 1
        result.last_error = f"{bad[-1].table}: {bad[-1].reason}"
    if dropped:
        add_tombstones_locked(lake, dropped)  # before the segments go: their feedback may come later
    for seg in segments:  # only after every partition file is durable
        seg.unlink()
    if segments:
        fd = os.open(segments[0].parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    result.segments += len(segments)


def _read(segments: list[Path], result: CompactResult) -> tuple[list[_Row], list[Bad]]:
    rows: list[_Row] = []
    bad: list[Bad] = []
    for seg in segments:
        for kind, raw in wal.read_segment(seg):
            if kind not in ID_COLUMN:
                continue
            result.rows_read[kind] += 1
            try:
                rows.append(_prepare(kind, raw, seg.name))
            except PREPARE_ERRORS as exc:
                bad.append(Bad(kind, raw, reason_of(exc), seg.name))
    return rows, bad


def _drop_forgotten(rows: list[_Row], bad: list[Bad], rules: ForgetRules, tombstones: set[str],
                    result: CompactResult) -> tuple[list[_Row], list[Bad], set[str]]:
    """Drop rows under a forget request, good or bad (a forgotten row is never quarantined either), and the
    feedback of the interactions dropped. Returns the rest and the ids to tombstone (user requests only:
    a whole-org request covers its feedback by org_id). `tombstones` grows for the pass's later batches."""
    if not rules and not tombstones:
        return rows, bad, set()
    dropped: set[str] = set()
    user_level: set[str] = set()
    for kind, raw in [*((r.kind, r.raw) for r in rows), *((b.table, b.raw) for b in bad)]:
        if kind == "interactions" and rules.drops(kind, raw, tombstones) and isinstance(raw.get("event_id"), str):
            dropped.add(raw["event_id"])
            if not rules.covers(raw.get("org_id"), None):
                user_level.add(raw["event_id"])
    tombstones |= dropped
    keep_rows = [r for r in rows if not rules.drops(r.kind, r.raw, tombstones)]
    keep_bad = [b for b in bad if not rules.drops(b.table, b.raw, tombstones)]
    result.forgotten += len(rows) + len(bad) - len(keep_rows) - len(keep_bad)
    return keep_rows, keep_bad, user_level


def _group(rows: list[_Row], result: CompactResult) -> dict[tuple[str, str], dict[str, _Row]]:
    groups: dict[tuple[str, str], dict[str, _Row]] = defaultdict(dict)
    for r in rows:
        if r.key in groups[(r.kind, r.part)]:
            result.duplicates += 1
            continue
        groups[(r.kind, r.part)][r.key] = r
    return groups


def _write_groups(groups: dict[tuple[str, str], dict[str, _Row]], lake: Lake, result: CompactResult,
                  tag: str) -> list[Bad]:
    """One Parquet file per partition of the rows not already there; returns the rows that did not convert."""
    bad: list[Bad] = []
    for (kind, part), rows in sorted(groups.items()):
        have = existing_ids(lake, part, ID_COLUMN[kind])
        fresh = [r for k, r in rows.items() if k not in have]
        result.duplicates += len(rows) - len(fresh)
        if not fresh:
            continue
        fresh.sort(key=lambda r: (r.row[TS_COLUMN[kind]], r.key))
        table, refused = _convert(kind, fresh)
        bad += refused
        if table is None:
            continue
        result.files.append(lake.write_parquet(f"{part}/part-{tag}.parquet", table))
        result.rows_written[kind] += table.num_rows
    return bad


def _table(kind: str, rows: list[_Row]) -> pa.Table:
    """Rows -> the contract's table; raises when a value does not fit (Parquet would refuse a null in a
    required column only when writing, so that is checked here)."""
    t = to_table(kind, [r.row for r in rows])
    for f in t.schema:
        if not f.nullable and t.column(f.name).null_count:
            raise ValueError(f"column {f.name!r} is required but null")
    return t


def _which_column(kind: str, row: dict[str, Any], exc: Exception) -> str:
    """The reason for one refused row, naming its first column that does not convert (Arrow's message
    names the value, not the column)."""
    for f in SCHEMAS[kind]:
        v = row.get(f.name)
        if v is None and not f.nullable:
            return f"{f.name}: required but null"[:MAX_REASON]
        try:
            pa.array([v], type=f.type)
        except CONVERT_ERRORS as col_exc:
            return f"{f.name}: {reason_of(col_exc)}"[:MAX_REASON]
    return reason_of(exc)


def _convert(kind: str, rows: list[_Row]) -> tuple[pa.Table | None, list[Bad]]:
    """The fast path converts the partition's rows at once; only if that fails are the halves converted
    apart, recursively, until each bad row is alone: k bad rows among n cost O(k log n) conversions, and
    the good rows keep their order."""
    try:
        return _table(kind, rows), []
    except CONVERT_ERRORS as exc:
        if len(rows) == 1:
            return None, [Bad(kind, rows[0].raw, _which_column(kind, rows[0].row, exc), rows[0].segment)]
    mid = len(rows) // 2
    (left, lbad), (right, rbad) = _convert(kind, rows[:mid]), _convert(kind, rows[mid:])
    tables = [t for t in (left, right) if t is not None]
    return (pa.concat_tables(tables) if tables else None), lbad + rbad
