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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rl_core.config import Config
from rl_core.duck import bind_files, connect, file_urls, load_sql, write_stream
from rl_core.lake import Lake
from rl_core.schema import EPISODES_SCHEMA, FEEDBACK_SCHEMA, INTERACTIONS_SCHEMA

if TYPE_CHECKING:
    from rl_core.ledger import Lineage

BATCH_ROWS = 65_536

@dataclass
class HarvestResult:
    run_id: str
    path: str
    start: str
    end: str
    policy_version: int
    granularity: str
    n_interactions: int  # in the window, any version
    n_episodes: int
    n_stale: int  # in the window but outside [policy_version - max_staleness, policy_version]
    n_with_feedback: int
    n_interaction_files: int
    n_feedback_files: int
    n_excluded: int = 0  # in the window but opted out or forgotten (data rights)
    org_id: str | None = None  # set for a per-organisation harvest
    n_consumed: int = 0  # in the window and the version bound, but already trained on in the lineage (ledger)
    lineage: str | None = None  # the ledger's lineage the harvest consulted (None: none)
    consumed_by: list[dict] = field(default_factory=list)  # [{run_id, version, n}]: who consumed them

    def skip_reason(self) -> str | None:
        """Why this window has nothing to train on, when that is not a data defect: no traffic at all, or
        only episodes the lineage already trained on. None when there are episodes, or when the window's
        traffic is all stale or excluded (the gates then say what is wrong with it)."""
        window = f"[{self.start}, {self.end})"
        if self.n_interactions == 0:
            return f"no traffic in {window}: the lake has no interaction in this window, nothing to train on"
        if self.n_episodes == 0 and self.n_consumed:
            runs = ", ".join(f"run {c['run_id']} (v{c['version']}, {c['n']})" for c in self.consumed_by)
            return (f"nothing new in {window}: all {self.n_consumed} episodes of policy v{self.policy_version} "
                    f"were already trained on in lineage {self.lineage} by {runs or 'earlier runs'}")
        return None


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
    from rl_core.forget import load_registry

    pairs = {(org, None) for org in cfg.harvest.opt_out_orgs}
    pairs |= {(r["org_id"], r.get("user_id")) for r in load_registry(lake)}
    rows = sorted(pairs, key=lambda p: (p[0], p[1] or ""))
    return pa.table({"org_id": [p[0] for p in rows], "user_id": [p[1] for p in rows]}, schema=EXCLUDED_SCHEMA)


# Columns an episode takes from its interaction as they are in the lake (sql/harvest.sql adds the rest).
LAKE_COLUMNS = [n for n in EPISODES_SCHEMA.names if n in INTERACTIONS_SCHEMA.names]


def _read_lake_columns(lake: Lake, path: str, rows: pa.ChunkedArray) -> pa.Table:
    """LAKE_COLUMNS of rows `rows` (sorted file_row_numbers) of one interaction file."""
    with contextlib.ExitStack() as stack:
        src = path if lake.is_local else stack.enter_context(lake.fs.open(path, "rb"))  # local: native reads
        pf = pq.ParquetFile(src)
        have = set(pf.schema_arrow.names)
        table = pf.read(columns=[c for c in LAKE_COLUMNS if c in have])
    if rows.length() != table.num_rows:
        table = table.take(rows)
    for c in LAKE_COLUMNS:  # files written before a column existed
        if c not in have:
            field = EPISODES_SCHEMA.field(c)
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    return table


def _episode_batches(lake: Lake, joined: pa.Table, paths: dict[str, str]):
    """Episodes file by file, in lake order: the lake columns of the selected rows of each interaction
    file beside what sql/harvest.sql joined to them (its rows are ordered by filename, file_row_number).
    One file is read ahead in a thread while the previous one is written (Arrow releases the GIL for
    both), and no more than two are in memory: a window never sits in memory whole."""
    if not joined.num_rows:
        return
    names = joined["filename"].combine_chunks()
    extra = joined.drop_columns(["filename", "file_row_number"])
    bounds = [0] + pc.run_end_encode(names).run_ends.to_pylist()  # one run per file
    spans = list(zip(bounds[:-1], bounds[1:], strict=True))

    def read(span: tuple[int, int]) -> pa.Table:
        lo, hi = span
        return _read_lake_columns(lake, paths[names[lo].as_py()], joined["file_row_number"].slice(lo, hi - lo))

    with ThreadPoolExecutor(max_workers=1) as pool:
        ahead = pool.submit(read, spans[0])
        for i, (lo, hi) in enumerate(spans):
            table = ahead.result()
            if i + 1 < len(spans):
                ahead = pool.submit(read, spans[i + 1])
            part = extra.slice(lo, hi - lo)
            for c in part.column_names:
                table = table.append_column(c, part[c])
            yield from table.to_batches()


# --- the stage ----------------------------------------------------------------------------------------

def harvest(cfg: Config, start: datetime, end: datetime, policy_version: int, run_id: str,
            org_id: str | None = None, lineage: Lineage | None = None) -> HarvestResult:
    """Write runs/<run_id>/episodes.parquet (+ harvest.json) for interactions in [start, end)
    (of org_id only, when given), leaving out opted-out orgs and forgotten orgs/users, and (given the policy's
    lineage) episodes other runs of that lineage already trained on."""
    from rl_core.ledger import bind_consumed  # the ledger reads the lake through this module's helpers

    start, end = utc(start, "start"), utc(end, "end")
    if org_id is not None and (not isinstance(org_id, str) or not org_id.strip()):
        raise ValueError(f"org_id must be a non-empty string or None, got {org_id!r}")
    if end <= start:
        raise ValueError(f"end ({end.isoformat()}) must be after start ({start.isoformat()})")
    if not isinstance(policy_version, int) or isinstance(policy_version, bool) or policy_version < 1:
        raise ValueError(f"policy_version must be an integer >= 1, got {policy_version!r}")
    hc = cfg.harvest
    lake = Lake(cfg.lake_root)
    run = lake.run(run_id)  # validates run_id before anything is read or written
    grace_end = end + timedelta(hours=hc.grace_hours)
    ifiles = lake.list_window("interactions", start, end)
    ffiles = lake.list_window("feedback", start, grace_end)

    con = connect(lake, memory_limit=cfg.harvest.duckdb_memory_limit)
    try:
        bind_files(con, lake, "interactions", ifiles, INTERACTIONS_SCHEMA, located=True)
        bind_files(con, lake, "feedback", ffiles, FEEDBACK_SCHEMA)
        excluded = excluded_table(cfg, lake)
        con.register("excluded", excluded)
        bind_consumed(con, lake, lineage)
        counts = {"start": start, "end": end, "org_id": org_id, "policy_version": policy_version,
                  "max_staleness": hc.max_staleness, "run_id": run_id}
        params = counts | {"grace_end": grace_end, "granularity": hc.granularity, "discount": hc.session_discount}
        n_window, n_excluded, n_consumed = con.execute(load_sql("harvest_counts.sql"), counts).fetchall()[0]
        consumed_by = [{"run_id": r, "version": int(v), "n": int(n)} for r, v, n in con.execute(
            load_sql("ledger/consumed_in_window.sql"), counts).fetchall()] if n_consumed else []
        joined = con.sql(load_sql("harvest.sql"), params=params).to_arrow_table()
    finally:
        con.close()
    batches = _episode_batches(lake, joined, dict(zip(file_urls(lake, ifiles), ifiles, strict=True)))
    path, n_rows, n_fb = write_stream(lake, episodes_path(lake, run_id), batches, EPISODES_SCHEMA)
    result = HarvestResult(
        run_id=run_id, path=path, start=start.isoformat(), end=end.isoformat(), policy_version=policy_version,
        granularity=hc.granularity, n_interactions=int(n_window), n_episodes=n_rows,
        n_stale=int(n_window) - n_rows - int(n_excluded) - int(n_consumed), n_with_feedback=n_fb,
        n_interaction_files=len(ifiles), n_feedback_files=len(ffiles), n_excluded=int(n_excluded), org_id=org_id,
        n_consumed=int(n_consumed), lineage=None if lineage is None else str(lineage), consumed_by=consumed_by,
    )
    manifest = asdict(result) | {"path": episodes_path(lake, run_id), "max_staleness": hc.max_staleness,
                                  "grace_hours": hc.grace_hours, "session_discount": hc.session_discount,
                                  "opt_out_orgs": sorted(hc.opt_out_orgs),
                                  "excluded_rules": excluded.num_rows}  # counts only: no forgotten user ids here
    lake.write_json(run.manifest, manifest)
    return result


def read_manifest(lake: Lake, run_id: str) -> dict | None:
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
    from rl_core.config import load_config

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
