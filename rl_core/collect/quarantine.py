"""Quarantine: WAL rows compaction cannot write into the lake's typed tables, kept with their reason.

A row that does not fit its Parquet schema (turn_index 2**40 into int32, a token id beyond int32, a null in
a required column, a timestamp that is not one, a row that is not an object) would make every compaction
pass fail and keep every other organisation's acknowledged events in the WAL. Compaction writes such a row
here instead and lands the rest of the pass.

Layout: `quarantine/<table>/date=YYYY-MM-DD/part-<tag>.parquet`, `<tag>` derived from the WAL segments
of the pass (a pass rerun after a crash rewrites the same file, never a copy) and the date from the first
segment's name. Columns: quarantined_at, table, reason, segment, event_id, org_id, user_id (each id only
where it was a string, so `rtrl forget` finds a subject's quarantined rows too) and row_json (the row as it
was in the WAL). Nothing reads this as data: harvest and the index read `raw/` only; an operator inspects,
fixes and re-posts, or deletes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rl_core.lake import Lake
from rl_core.schema import TS

ROOT = "quarantine"
MAX_REASON = 500
SCHEMA = pa.schema([
    pa.field("quarantined_at", TS, nullable=False),
    pa.field("table", pa.string(), nullable=False),
    pa.field("reason", pa.string(), nullable=False),
    pa.field("segment", pa.string(), nullable=False),
    pa.field("event_id", pa.string()),
    pa.field("org_id", pa.string()),
    pa.field("user_id", pa.string()),
    pa.field("row_json", pa.string(), nullable=False),
])
_SEG_DATE = re.compile(r"seg-(\d{4})(\d{2})(\d{2})T")


@dataclass
class Bad:
    """One row compaction refused: its table, the WAL row as read, why, and the segment it came from."""

    table: str
    raw: Any
    reason: str
    segment: str


@dataclass
class QuarantineStatus:
    count: int = 0  # rows in quarantine/ (all tables, all dates)
    last_error: str | None = None  # "<table>: <reason>" of the newest quarantined row
    last_at: str | None = None  # its quarantined_at (ISO)


def reason_of(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:MAX_REASON]


def _text(raw: Any, key: str) -> str | None:
    v = raw.get(key) if isinstance(raw, dict) else None
    return v if isinstance(v, str) else None


def _row_json(raw: Any) -> str:
    try:
        return json.dumps(raw, ensure_ascii=True, sort_keys=True)
    except (TypeError, ValueError):
        return json.dumps(repr(raw))


def _date_of(segment: str) -> str:
    m = _SEG_DATE.match(Path(segment).name)
    return f"{m[1]}-{m[2]}-{m[3]}" if m else datetime.now(timezone.utc).strftime("%Y-%m-%d")


def write(lake: Lake, bad: list[Bad], tag: str) -> list[str]:
    """Write one pass's refused rows, one file per table; returns the paths."""
    now, paths = datetime.now(timezone.utc), []
    for table in sorted({b.table for b in bad}):
        rows = [b for b in bad if b.table == table]
        t = pa.table({
            "quarantined_at": [now] * len(rows), "table": [table] * len(rows),
            "reason": [b.reason[:MAX_REASON] for b in rows], "segment": [b.segment for b in rows],
            "event_id": [_text(b.raw, "event_id") for b in rows], "org_id": [_text(b.raw, "org_id") for b in rows],
            "user_id": [_text(b.raw, "user_id") for b in rows], "row_json": [_row_json(b.raw) for b in rows],
        }, schema=SCHEMA)
        paths.append(lake.write_parquet(f"{ROOT}/{table}/date={_date_of(rows[0].segment)}/part-{tag}.parquet", t))
    return paths


def status(lake: Lake) -> QuarantineStatus:
    """Rows in quarantine and the newest one's reason (three small columns of each file are read)."""
    tables = []
    for p in lake.list_files(ROOT):
        with lake.fs.open(p, "rb") as f:
            tables.append(pq.read_table(f, columns=["quarantined_at", "table", "reason"]))
    t = pa.concat_tables(tables) if tables else None
    if t is None or t.num_rows == 0:
        return QuarantineStatus()
    i = max(range(t.num_rows), key=lambda j: t["quarantined_at"][j].as_py())
    return QuarantineStatus(t.num_rows, f"{t['table'][i].as_py()}: {t['reason'][i].as_py()}",
                            t["quarantined_at"][i].as_py().isoformat())


def read(lake: Lake, table: str | None = None) -> list[dict]:
    """Every quarantined row (of one table, or all), for operators and tests."""
    root = f"{ROOT}/{table}" if table else ROOT
    out: list[dict] = []
    for p in lake.list_files(root):
        with lake.fs.open(p, "rb") as f:
            out += pq.read_table(f).to_pylist()
    return out
