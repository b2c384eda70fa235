"""`rtrl forget --org O [--user U]`: remove an organisation's (or one user's) rows from the lake.

Data rights are honoured where the data lives: every raw partition and every run output holding a
matching row is rewritten without it (atomically: the new file replaces the old one in one rename; a
file left empty is deleted). Feedback rows go with the interactions they refer to. Each request is
recorded under forget/requests/ and in forget/registry.json, which the collector's compaction and
harvest consult, so events still in flight are dropped when they land and later cycles never see them.
"""

from __future__ import annotations

import argparse
import json
import uuid
from dataclasses import asdict, dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rl_core.config import load_config
from rl_core.lake import Lake, lake_from_config
from rl_core.schema import now_utc

REGISTRY = "forget/registry.json"


@dataclass
class ForgetReport:
    request_id: str
    org_id: str
    user_id: str | None
    interactions_removed: int = 0
    feedback_removed: int = 0
    run_rows_removed: int = 0
    files_rewritten: int = 0
    files_deleted: int = 0
    ts: str = field(default_factory=lambda: now_utc().isoformat())


def _match(table: pa.Table, org_id: str, user_id: str | None, event_ids: pa.Array | None) -> pa.Array:
    """Boolean mask of rows to forget in any lake table."""
    cols = table.column_names
    mask = pc.equal(table["org_id"], org_id) if "org_id" in cols else pa.array([False] * table.num_rows)
    if user_id is not None:
        if "user_id" in cols:
            mask = pc.and_(mask, pc.equal(table["user_id"], user_id))
        elif "event_id" in cols and event_ids is not None:
            mask = pc.and_(mask, pc.is_in(table["event_id"], value_set=event_ids))
        else:
            mask = pa.array([False] * table.num_rows)
    return pc.fill_null(mask, False)


def _rewrite(lake: Lake, path: str, org_id: str, user_id: str | None, event_ids, rep: ForgetReport) -> tuple[int, pa.Array | None]:
    with lake.fs.open(path, "rb") as f:
        table = pq.read_table(f)
    if table.num_rows == 0:
        return 0, None
    mask = _match(table, org_id, user_id, event_ids)
    n = pc.sum(mask).as_py() or 0
    if n == 0:
        return 0, None
    removed_ids = table.filter(mask)["event_id"] if "event_id" in table.column_names else None
    kept = table.filter(pc.invert(mask))
    rel = path[len(lake.base.rstrip("/")) + 1:]
    if kept.num_rows == 0:
        lake.fs.rm(path)
        rep.files_deleted += 1
    else:
        lake.write_parquet(rel, kept)
        rep.files_rewritten += 1
    return n, removed_ids


def forget(lake: Lake, org_id: str, user_id: str | None = None, reason: str = "") -> ForgetReport:
    if not org_id:
        raise ValueError("--org is required")
    rep = ForgetReport(request_id=uuid.uuid4().hex, org_id=org_id, user_id=user_id)
    removed: list[pa.Array] = []
    for path in lake.list_files("raw/interactions"):
        n, ids = _rewrite(lake, path, org_id, user_id, None, rep)
        rep.interactions_removed += n
        if ids is not None:
            removed.append(ids)
    event_ids = pa.concat_arrays([a.combine_chunks() if hasattr(a, "combine_chunks") else a for a in removed]) if removed else pa.array([], pa.string())
    for path in lake.list_files("raw/feedback"):
        n, _ = _rewrite(lake, path, org_id, user_id, event_ids, rep)
        rep.feedback_removed += n
    for path in lake.list_files("runs"):
        n, _ = _rewrite(lake, path, org_id, user_id, event_ids, rep)
        rep.run_rows_removed += n
    record(lake, rep, reason)
    return rep


def record(lake: Lake, rep: ForgetReport, reason: str) -> None:
    entry = {**asdict(rep), "reason": reason}
    lake.write_json(f"forget/requests/{rep.ts[:10]}-{rep.request_id}.json", entry)
    registry = load_registry(lake)
    registry.append({"org_id": rep.org_id, "user_id": rep.user_id, "ts": rep.ts, "request_id": rep.request_id})
    lake.write_json(REGISTRY, registry)


def load_registry(lake: Lake) -> list[dict]:
    return lake.read_json(REGISTRY) if lake.exists(REGISTRY) else []


def is_forgotten(registry: list[dict], org_id: str, user_id: str | None) -> bool:
    """True when a row of (org_id, user_id) falls under a recorded forget request."""
    return any(r["org_id"] == org_id and (r["user_id"] is None or r["user_id"] == user_id) for r in registry)


def add_forget(p: argparse.ArgumentParser) -> None:
    p.add_argument("--org", required=True, help="organisation whose rows are removed")
    p.add_argument("--user", default=None, help="only this user's rows (default: the whole organisation)")
    p.add_argument("--reason", default="data deletion request")
    p.set_defaults(run=_run)


def _run(args) -> int:
    rep = forget(lake_from_config(load_config()), args.org, args.user, args.reason)
    print(json.dumps(asdict(rep), indent=2))
    return 0
