"""Harvest: one cycle's window of raw interactions + feedback -> runs/<run_id>/episodes.parquet.

DuckDB reads the window's Parquet files straight from the lake (sql/harvest.sql does the selection,
the join and the feedback aggregation), so a million interactions never pass through pandas or Python
rows. The output is sorted and written atomically: the same window, policy version and config always
give the same file, which is what makes Airflow retries and backfills safe.
Data rights are applied here, before anything is trained on: rows of an org in harvest.opt_out_orgs and
rows under a recorded `rtrl forget` request (forget/registry.json) never become episodes, even when they
reach the lake after the request (events still in flight). `org_id=` narrows a harvest to one
organisation, for its adapter (rl_core/orgs).
Given the policy's lineage, the harvest also leaves out episodes that lineage already trained on (the ledger,
rl_core/ledger.py), so overlapping windows never train an episode twice; `HarvestResult.skip_reason` says
when a window has nothing to train on at all (no traffic, or only consumed episodes).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from dataclasses import asdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rl_core.artifacts import HarvestResult
from rl_core.config import Config, load_config
from rl_core.duck import bind_files, connect, file_urls, load_sql, write_stream
from rl_core.forget import load_registry
from rl_core.lake import Lake
from rl_core.ledger import Lineage, bind_consumed
from rl_core.schema import EPISODES_SCHEMA, FEEDBACK_SCHEMA, INTERACTIONS_SCHEMA

BATCH_ROWS = 65_536


def utc(ts: datetime, field: str) -> datetime:
    if not isinstance(ts, datetime):
        raise ValueError(f"{field} must be a datetime, got {ts!r}")
    if ts.tzinfo is None:
        raise ValueError(f"{field} must be timezone-aware (UTC), got naive {ts.isoformat()}")
    return ts.astimezone(timezone.utc)


def episodes_path(lake: Lake, run_id: str) -> str:
    return lake.run(run_id).episodes


EXCLUDED_SCHEMA = pa.schema([("org_id", pa.string()), ("user_id", pa.string())])


def excluded_table(cfg: Config, lake: Lake) -> pa.Table:
    """(org_id, user_id) pairs never harvested: opted-out orgs and forget requests; user_id None = whole org."""
    pairs = {(org, None) for org in cfg.harvest.opt_out_orgs}
    pairs |= {(r["org_id"], r.get("user_id")) for r in load_registry(lake)}
    rows = sorted(pairs, key=lambda p: (p[0], p[1] or ""))
    return pa.table({"org_id": [p[0] for p in rows], "user_id": [p[1] for p in rows]}, schema=EXCLUDED_SCHEMA)


# Columns an episode takes from its interaction as they are in the lake (sql/harvest.sql adds the rest).
LAKE_COLUMNS = [n for n in EPISODES_SCHEMA.names if n in INTERACTIONS_SCHEMA.names]


READ_ROWS = 8_192  # rows decoded at once from an interaction file: its wide columns are ~1 KB a row


class _FileCursor:
    """The LAKE_COLUMNS of one interaction file, decoded forward READ_ROWS at a time, taking the rows asked
    for: in memory, one row group compressed (Arrow reads it in a few large ranges, which S3 wants) and one
    batch decoded, never the file decoded whole (a bench file of 500k interactions decodes to ~1.2 GB).
    Rows must be asked for in increasing order, which is the order sql/harvest.sql returns them in."""

    def __init__(self, lake: Lake, path: str):
        self.name, self._stack = path, contextlib.ExitStack()
        src = path if lake.is_local else self._stack.enter_context(lake.fs.open(path, "rb"))  # local: native reads
        pf = self._stack.enter_context(pq.ParquetFile(src))
        self.missing = [c for c in LAKE_COLUMNS if c not in pf.schema_arrow.names]  # files older than a column
        self._batches = pf.iter_batches(batch_size=READ_ROWS, columns=[c for c in LAKE_COLUMNS
                                                                          if c not in self.missing])
        self._batch, self._offset = None, 0  # the decoded batch and the file row number of its first row

    def take(self, rows: np.ndarray) -> pa.Table:
        """The rows with these file row numbers (sorted, all after any asked for before), as a table."""
        pieces, i = [], 0
        while i < len(rows):
            if self._batch is None or rows[i] >= self._offset + self._batch.num_rows:
                self._offset += 0 if self._batch is None else self._batch.num_rows
                self._batch = next(self._batches, None)
                if self._batch is None:
                    raise ValueError(f"{self.name} has no row {rows[i]} (it changed while being harvested?)")
                continue
            j = int(np.searchsorted(rows, self._offset + self._batch.num_rows))
            lo, hi = int(rows[i]) - self._offset, int(rows[j - 1]) - self._offset
            contiguous = hi - lo == j - i - 1  # every row of a stretch: a zero-copy slice instead of a take
            pieces.append(self._batch.slice(lo, j - i) if contiguous else self._batch.take(rows[i:j] - self._offset))
            i = j
        table = pa.Table.from_batches(pieces)
        for c in self.missing:
            field = EPISODES_SCHEMA.field(c)
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
        return table.select(LAKE_COLUMNS)

    def close(self) -> None:
        self._stack.close()


def _episode_batches(lake: Lake, joined: pa.RecordBatchReader, files: list[str]):
    """Episodes in lake order: what sql/harvest.sql joined to each selected interaction (streamed from DuckDB,
    ordered by file_no, file_row_number; files[file_no] is its path) beside the lake columns of that interaction,
    read forward from its file. Neither the join's result nor a file is ever in memory whole: a batch of each at a time."""
    cursor = None
    try:
        for batch in joined:
            if not batch.num_rows:
                continue
            numbers, tables = batch.column("file_no"), []
            bounds = [0] + pc.run_end_encode(numbers).run_ends.to_pylist()  # one run per file
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
                path = files[numbers[lo].as_py()]
                if cursor is None or cursor.name != path:
                    if cursor is not None:
                        cursor.close()
                    cursor = _FileCursor(lake, path)
                tables.append(cursor.take(batch.column("file_row_number").slice(lo, hi - lo).to_numpy()))
            table = pa.concat_tables(tables).combine_chunks()  # one row group per batch in the episodes file
            for c in batch.schema.names:
                if c not in ("file_no", "file_row_number"):
                    table = table.append_column(c, batch.column(c))
            yield from table.to_batches()
    finally:
        if cursor is not None:
            cursor.close()


# --- the stage ----------------------------------------------------------------------------------------

def plan_parts(start: datetime, end: datetime, hours: int,
               granularity: str = "turn") -> list[tuple[datetime, datetime]]:
    """The window cut at hour boundaries into parts of `hours` hours (the first and last may be shorter);
    hours 0: one part, the whole window. A part owns whole hour partitions of the lake, so harvesting the
    parts and concatenating them in order (merge_parts) gives the window's harvest row for row. Turn
    granularity only: a session's outcome is summed over its turns, which a cut would split."""
    start, end = utc(start, "start"), utc(end, "end")
    if not isinstance(hours, int) or isinstance(hours, bool) or hours < 0:
        raise ValueError(f"map_hours must be an integer >= 0, got {hours!r}")
    if hours and granularity != "turn":
        raise ValueError(f"map_hours = {hours} needs harvest.granularity = 'turn', not {granularity!r}: a "
                         "session's outcome is summed over its turns, which parts cut at hours would split")
    if hours == 0 or end <= start:
        return [(start, end)]
    cuts, t = [start], start.replace(minute=0, second=0, microsecond=0) + timedelta(hours=hours)
    while t < end:
        cuts.append(t)
        t += timedelta(hours=hours)
    return list(zip(cuts, [*cuts[1:], end], strict=True))


@contextlib.contextmanager
def _select(cfg: Config, lake: Lake, ifiles: list[str], ffiles: list[str], counts: dict, grace_end: datetime,
            lineage: Lineage | None) -> Iterator[tuple[pa.RecordBatchReader, tuple[int, int, int], list[dict], int]]:
    """sql/harvest.sql over the bound files, streamed: a reader of the episodes' places in the lake and what
    the join adds (DuckDB sorts within harvest.duckdb_memory_limit, spilling past it), the window's counts
    (all, excluded, consumed), who consumed what, and the number of exclusion rules. The connection lives
    as long as the context, so the reader is read inside it."""

    hc = cfg.harvest
    params = counts | {"grace_end": grace_end, "granularity": hc.granularity, "discount": hc.session_discount}
    con = connect(lake, memory_limit=hc.duckdb_memory_limit)
    try:
        bind_files(con, lake, "interactions", ifiles, INTERACTIONS_SCHEMA, located=True)
        con.register("lake_files", pa.table({"filename": file_urls(lake, ifiles),
                                             "file_no": pa.array(range(len(ifiles)), pa.int32())}))
        bind_files(con, lake, "feedback", ffiles, FEEDBACK_SCHEMA)
        excluded = excluded_table(cfg, lake)
        con.register("excluded", excluded)
        bind_consumed(con, lake, lineage)
        n = con.execute(load_sql("harvest_counts.sql"), counts).fetchall()[0]
        consumed_by = [{"run_id": r, "version": int(v), "n": int(k)} for r, v, k in con.execute(
            load_sql("ledger/consumed_in_window.sql"), counts).fetchall()] if n[2] else []
        joined = con.sql(load_sql("harvest.sql"), params=params).to_arrow_reader(BATCH_ROWS)
        yield joined, (int(n[0]), int(n[1]), int(n[2])), consumed_by, excluded.num_rows
    finally:
        con.close()


def harvest(cfg: Config, start: datetime, end: datetime, policy_version: int, run_id: str,
            org_id: str | None = None, lineage: Lineage | None = None,
            part: tuple[datetime, datetime] | None = None) -> HarvestResult:
    """Write runs/<run_id>/episodes.parquet (+ harvest.json) for interactions in [start, end)
    (of org_id only, when given), leaving out opted-out orgs and forgotten orgs/users, and (given the policy's
    lineage) episodes other runs of that lineage already trained on.
    part=(s, e), a part of the window from plan_parts: only its interactions, joined with the window's
    feedback (until end + grace), written to runs/<run_id>/parts/ without a manifest, for merge_parts."""
    start, end = utc(start, "start"), utc(end, "end")
    if org_id is not None and (not isinstance(org_id, str) or not org_id.strip()):
        raise ValueError(f"org_id must be a non-empty string or None, got {org_id!r}")
    if end <= start:
        raise ValueError(f"end ({end.isoformat()}) must be after start ({start.isoformat()})")
    if not isinstance(policy_version, int) or isinstance(policy_version, bool) or policy_version < 1:
        raise ValueError(f"policy_version must be an integer >= 1, got {policy_version!r}")
    lo, hi = (start, end) if part is None else (utc(part[0], "part start"), utc(part[1], "part end"))
    if not start <= lo < hi <= end:
        raise ValueError(f"part [{lo.isoformat()}, {hi.isoformat()}) is not inside the window "
                         f"[{start.isoformat()}, {end.isoformat()})")
    hc = cfg.harvest
    lake = Lake(cfg.lake_root)
    run = lake.run(run_id)  # validates run_id before anything is read or written
    grace_end = end + timedelta(hours=hc.grace_hours)
    ifiles = sorted(lake.list_window("interactions", lo, hi))  # lake order: sql/harvest.sql's file_no is the index
    ffiles = lake.list_window("feedback", start, grace_end)
    counts = {"start": lo, "end": hi, "org_id": org_id, "policy_version": policy_version,
              "max_staleness": hc.max_staleness, "run_id": run_id}
    out = run.episodes if part is None else run.part(lo)
    with _select(cfg, lake, ifiles, ffiles, counts, grace_end, lineage) as (
            joined, (n_window, n_excluded, n_consumed), consumed_by, n_rules):
        batches = _episode_batches(lake, joined, ifiles)
        path, n_rows, n_fb = write_stream(lake, out, batches, EPISODES_SCHEMA)
    result = HarvestResult(
        run_id=run_id, path=path, start=lo.isoformat(), end=hi.isoformat(), policy_version=policy_version,
        granularity=hc.granularity, n_interactions=n_window, n_episodes=n_rows,
        n_stale=n_window - n_rows - n_excluded - n_consumed, n_with_feedback=n_fb,
        n_interaction_files=len(ifiles), n_feedback_files=len(ffiles), n_excluded=n_excluded, org_id=org_id,
        n_consumed=n_consumed, lineage=None if lineage is None else str(lineage), consumed_by=consumed_by,
    )
    if part is None:
        _write_manifest(cfg, lake, result, n_rules)
    return result


def merge_parts(cfg: Config, start: datetime, end: datetime, run_id: str,
                parts: list[HarvestResult]) -> HarvestResult:
    """The window's harvest from its parts (the mapped harvest tasks' results, in any order): their files
    concatenated in time order into runs/<run_id>/episodes.parquet, streamed, and their counts summed into
    harvest.json. The same rows in the same order as one harvest of the window (tests/test_harvest_parts.py).
    A window harvested as one part was written in place: it is returned as it is."""
    start, end = utc(start, "start"), utc(end, "end")
    lake = Lake(cfg.lake_root)
    run = lake.run(run_id)
    parts = sorted(parts, key=lambda r: r.start)
    bounds = [(datetime.fromisoformat(r.start), datetime.fromisoformat(r.end)) for r in parts]
    tiled = all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    if not bounds or not tiled or bounds[0][0] != start or bounds[-1][1] != end:
        raise ValueError(f"parts {[(a.isoformat(), b.isoformat()) for a, b in bounds]} do not tile the window "
                         f"[{start.isoformat()}, {end.isoformat()})")
    if {(r.run_id, r.policy_version, r.org_id, r.lineage) for r in parts} != \
            {(run_id, parts[0].policy_version, parts[0].org_id, parts[0].lineage)}:
        raise ValueError(f"parts of different runs, policies, orgs or lineages cannot merge into {run_id}")
    if len(parts) == 1 and parts[0].path == lake.path(run.episodes):
        return parts[0]

    def batches():
        for r in parts:
            with lake.fs.open(r.path, "rb") as f:
                yield from pq.ParquetFile(f).iter_batches(batch_size=BATCH_ROWS)

    path, n_rows, n_fb = write_stream(lake, run.episodes, batches(), EPISODES_SCHEMA)
    consumed: dict[tuple[str, int], int] = {}
    for r in parts:
        for c in r.consumed_by:
            consumed[(c["run_id"], c["version"])] = consumed.get((c["run_id"], c["version"]), 0) + c["n"]
    total = {k: sum(getattr(r, k) for r in parts) for k in (
        "n_interactions", "n_stale", "n_excluded", "n_consumed", "n_interaction_files")}
    result = HarvestResult(
        run_id=run_id, path=path, start=start.isoformat(), end=end.isoformat(),
        policy_version=parts[0].policy_version, granularity=parts[0].granularity, n_episodes=n_rows,
        n_with_feedback=n_fb, n_feedback_files=max(r.n_feedback_files for r in parts), org_id=parts[0].org_id,
        lineage=parts[0].lineage, consumed_by=[{"run_id": k[0], "version": k[1], "n": n}
                                               for k, n in sorted(consumed.items())], **total)
    _write_manifest(cfg, lake, result, len(excluded_table(cfg, lake)), n_parts=len(parts))
    return result


def _write_manifest(cfg: Config, lake: Lake, result: HarvestResult, n_rules: int, n_parts: int = 1) -> None:
    hc = cfg.harvest
    manifest = asdict(result) | {"path": lake.run(result.run_id).episodes, "max_staleness": hc.max_staleness,
                                 "grace_hours": hc.grace_hours, "session_discount": hc.session_discount,
                                 "opt_out_orgs": sorted(hc.opt_out_orgs), "parts": n_parts,
                                 "excluded_rules": n_rules}  # counts only: no forgotten user ids here
    lake.write_json(lake.run(result.run_id).manifest, manifest)


def read_manifest(lake: Lake, run_id: str) -> dict | None:
    """The manifest as written, every key (rl_core.exclude extends it); a reader wants Lake.read_harvest."""
    path = lake.run(run_id).manifest
    return lake.read_json(path) if lake.exists(path) else None


# --- CLI --------------------------------------------------------------------------------------------

def _parse_ts(value: str) -> datetime:
    ts = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)


def add_harvest(p: argparse.ArgumentParser) -> None:
    p.add_argument("--start", required=True, type=_parse_ts, help="window start, ISO 8601 (UTC if no offset)")
    p.add_argument("--end", required=True, type=_parse_ts, help="window end (exclusive)")
    p.add_argument("--policy-version", required=True, type=int, help="the version being updated")
    p.add_argument("--run-id", required=True)
    p.add_argument("--org", default=None, help="only this organisation's interactions (per-org adapters)")
    p.set_defaults(run=_run)


def _run(args) -> int:
    try:
        r = harvest(load_config(), args.start, args.end, args.policy_version, args.run_id, org_id=args.org)
    except ValueError as exc:
        print(f"rtrl harvest: {exc}")
        return 2
    print(f"harvest {r.run_id}: {r.n_episodes} episodes ({r.n_with_feedback} with feedback) from "
          f"{r.n_interactions} interactions in [{r.start}, {r.end}); {r.n_stale} outside the version bound, "
          f"{r.n_excluded} opted out or forgotten")
    print(Path(r.path))
    return 0
