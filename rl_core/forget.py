"""`rtrl forget --org O [--user U]`: remove an organisation's (or one user's) rows wherever they are.

Data rights are honoured where the data lives: every raw partition, quarantined row and run output holding a
matching row is rewritten without it (atomically: the new file replaces the old one in one rename; a file
left empty is deleted), and so is every sealed write-ahead segment. Feedback goes with the interactions it
refers to, wherever each of them is.

Safe beside other work and across crashes:
- One lock (rl_core.collect.locks.lake_lock), shared with compaction, around the registry and every
  rewrite: two forgets never lose one another's registry entry, and a compaction pass never holds rows in
  flight (read from the WAL, not yet in the lake) while a forget rewrites the lake.
- The request enters forget/registry.json with status "pending" before anything is rewritten. From then on
  harvest excludes the subject and compaction drops its events; if this process dies part-way, the next
  forget or compaction pass resumes the pending request (every step is idempotent); "done" once all ran.
- The event ids of a forgotten user's interactions (lake, quarantine, WAL, and those compaction drops later)
  are kept in forget/tombstones.json: feedback on them is dropped from the lake, from sealed segments, and
  when it arrives later (compaction drops it; the gateway's event index forgets the ids, so /v1/feedback
  answers 404). A whole-org request needs no tombstones: feedback carries its org.
Rows in a live writer's open segment cannot be rewritten under it: compaction drops them when it seals.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rl_core.collect import wal
from rl_core.collect.locks import lake_lock
from rl_core.config import load_config
from rl_core.ids import check_org_id, check_text_id
from rl_core.lake import Lake, lake_from_config
from rl_core.schema import now_utc

REGISTRY = "forget/registry.json"
TOMBSTONES = "forget/tombstones.json"
REWRITTEN = ("raw/interactions", "raw/feedback", "quarantine", "runs")  # every place a subject's rows can be
COUNTER = {"raw/interactions": "interactions_removed", "raw/feedback": "feedback_removed",
           "quarantine": "quarantine_removed", "runs": "run_rows_removed"}


@dataclass
class ForgetReport:
    request_id: str
    org_id: str
    user_id: str | None
    interactions_removed: int = 0
    feedback_removed: int = 0
    run_rows_removed: int = 0
    quarantine_removed: int = 0
    wal_rows_removed: int = 0
    files_rewritten: int = 0
    files_deleted: int = 0
    ts: str = field(default_factory=lambda: now_utc().isoformat())


class ForgetRules:
    """The registry's requests as sets: O(1) per row for compaction, the index and forget itself."""

    def __init__(self, registry: Iterable[dict]):
        registry = list(registry)
        self.orgs = {r["org_id"] for r in registry if r.get("user_id") is None}
        self.users = {(r["org_id"], r["user_id"]) for r in registry if r.get("user_id") is not None}

    def covers(self, org_id: Any, user_id: Any) -> bool:
        """A row of (org_id, user_id) falls under a request (user_id None: only whole-org requests)."""
        if not isinstance(org_id, str):
            return False
        return org_id in self.orgs or (isinstance(user_id, str) and (org_id, user_id) in self.users)

    def drops(self, kind: str, row: dict, tombstones: set[str]) -> bool:
        """Is this WAL/lake row (interaction or feedback) to be dropped?"""
        if not isinstance(row, dict):
            return False
        if kind == "interactions":
            return self.covers(row.get("org_id"), row.get("user_id"))
        e = row.get("event_id")
        return self.covers(row.get("org_id"), None) or (isinstance(e, str) and e in tombstones)

    def __bool__(self) -> bool:
        return bool(self.orgs or self.users)


# --- registry and tombstones (read anywhere; written only under the lake lock) --------------------------
def load_registry(lake: Lake) -> list[dict]:
    return lake.read_json(REGISTRY) if lake.exists(REGISTRY) else []


def is_forgotten(registry: list[dict], org_id: str, user_id: str | None) -> bool:
    """True when a row of (org_id, user_id) falls under a recorded forget request."""
    return ForgetRules(registry).covers(org_id, user_id)


def load_tombstones(lake: Lake) -> set[str]:
    return set(lake.read_json(TOMBSTONES)["event_ids"]) if lake.exists(TOMBSTONES) else set()


def add_tombstones_locked(lake: Lake, event_ids: Iterable[str]) -> int:
    """Record more forgotten interactions' event ids (caller holds the lake lock); returns how many were new."""
    have = load_tombstones(lake)
    new = {e for e in event_ids if isinstance(e, str)} - have
    if new:
        lake.write_json(TOMBSTONES, {"event_ids": sorted(have | new)})
    return len(new)


def _checkpoint(stage: str) -> None:
    """Fault injection for the crash tests: RTRL_FAULT=forget:<stage> kills this process right here."""
    if os.environ.get("RTRL_FAULT") == f"forget:{stage}":
        os.kill(os.getpid(), signal.SIGKILL)


# --- the request --------------------------------------------------------------------------------------
def forget(lake: Lake, org_id: str, user_id: str | None = None, reason: str = "",
           wal_dir: str | Path | None = None) -> ForgetReport:
    """Forget an org (or one of its users) everywhere: lake, quarantine, runs, sealed segments of wal_dir."""
    if not org_id:
        raise ValueError("--org is required")
    check_org_id(org_id, "--org")
    if user_id is not None:
        check_text_id("--user", user_id)
    with lake_lock(lake):
        resume_pending_locked(lake, wal_dir)  # an earlier request that crashed part-way comes first
        entry = _register_locked(lake, org_id, user_id, reason)
        return _apply_locked(lake, entry, wal_dir)


def resume_pending_locked(lake: Lake, wal_dir: str | Path | None) -> list[ForgetReport]:
    """Finish every request a crash left pending (caller holds the lake lock: compaction, forget)."""
    return [_apply_locked(lake, e, wal_dir) for e in load_registry(lake) if e.get("status") == "pending"]


def _register_locked(lake: Lake, org_id: str, user_id: str | None, reason: str) -> dict:
    entry = {"org_id": org_id, "user_id": user_id, "ts": now_utc().isoformat(), "request_id": uuid.uuid4().hex,
             "status": "pending", "reason": reason}
    lake.write_json(REGISTRY, [*load_registry(lake), entry])  # durable before any rewrite
    _checkpoint("registered")
    return entry


def _apply_locked(lake: Lake, entry: dict, wal_dir: str | Path | None) -> ForgetReport:
    org_id, user_id = entry["org_id"], entry.get("user_id")
    rep = ForgetReport(request_id=entry["request_id"], org_id=org_id, user_id=user_id, ts=entry["ts"])
    rules = ForgetRules([entry])
    tombstones: set[str] = set()
    if user_id is not None:  # whole-org requests drop feedback by its org_id, no ids needed
        add_tombstones_locked(lake, _lake_event_ids(lake, org_id, user_id) | _wal_event_ids(wal_dir, rules))
        tombstones = load_tombstones(lake)
    _checkpoint("tombstoned")
    event_ids = pa.array(sorted(tombstones), pa.string())
    for root in REWRITTEN:
        for path in lake.list_files(root):
            n = _rewrite(lake, path, org_id, user_id, event_ids, rep)
            setattr(rep, COUNTER[root], getattr(rep, COUNTER[root]) + n)
        _checkpoint(root.replace("/", "-"))
    if wal_dir is not None:
        keep = _wal_keep(org_id, user_id, tombstones)
        rep.wal_rows_removed = sum(wal.rewrite_segment(seg, keep) for seg in wal.sealed_segments(wal_dir))
    _finish_locked(lake, entry, rep)
    return rep


def _finish_locked(lake: Lake, entry: dict, rep: ForgetReport) -> None:
    """The request's report under forget/requests/, then status done. A resumed request's report counts what
    the resuming run removed (a killed attempt's rewrites are done, not counted)."""
    path = f"forget/requests/{entry['ts'][:10]}-{entry['request_id']}.json"
    lake.write_json(path, {**asdict(rep), "reason": entry.get("reason", "")})
    registry = load_registry(lake)
    for e in registry:
        if e.get("request_id") == entry["request_id"]:
            e["status"] = "done"
    lake.write_json(REGISTRY, registry)


# --- finding and rewriting rows -------------------------------------------------------------------------
def _lake_event_ids(lake: Lake, org_id: str, user_id: str) -> set[str]:
    """Event ids of the user's interactions in the lake (raw and quarantined): three columns read."""
    ids: set[str] = set()
    none = pa.array([], pa.string())
    for path in [*lake.list_files("raw/interactions"), *lake.list_files("quarantine/interactions")]:
        with lake.fs.open(path, "rb") as f:
            t = pq.read_table(f, columns=["event_id", "org_id", "user_id"])
        ids.update(v for v in t.filter(_match(t, org_id, user_id, none))["event_id"].to_pylist() if v is not None)
    return ids


def _wal_event_ids(wal_dir: str | Path | None, rules: ForgetRules) -> set[str]:
    """Event ids of the subject's interactions in the WAL (open segments listed first: one sealed between
    the two listings is then read under its sealed name)."""
    if wal_dir is None:
        return set()
    ids: set[str] = set()
    for seg in [*wal.open_segments(wal_dir), *wal.sealed_segments(wal_dir)]:
        try:
            for kind, row in wal.read_segment(seg):
                if kind == "interactions" and isinstance(row, dict) and rules.covers(row.get("org_id"), row.get("user_id")):
                    ids.add(row.get("event_id"))
        except FileNotFoundError:
            continue
    return {e for e in ids if isinstance(e, str)}


def _wal_keep(org_id: str, user_id: str | None, tombstones: set[str]):
    """Which rows of a sealed segment stay: the request's whole org goes; otherwise a row (interaction or
    feedback) goes only once its event id is a tombstone. A user's interaction that arrived after the scan
    stays for compaction, which tombstones it as it drops it, so feedback arriving later is still dropped."""
    def keep(kind: str, row: Any) -> bool:
        if not isinstance(row, dict):
            return True
        if user_id is None and row.get("org_id") == org_id:
            return False
        e = row.get("event_id")
        return not (isinstance(e, str) and e in tombstones)
    return keep


def _match(table: pa.Table, org_id: str, user_id: str | None, event_ids: pa.Array) -> pa.Array:
    """Boolean mask of rows to forget in any lake table: the org's rows, and for a user request those of
    the user or (tables without a user, e.g. feedback) of the user's interactions."""
    cols = table.column_names
    none = pa.array([False] * table.num_rows)
    if "org_id" not in cols:
        return none
    mask = pc.equal(table["org_id"], org_id)
    if user_id is not None:
        who = pc.equal(table["user_id"], user_id) if "user_id" in cols else None
        if "event_id" in cols and len(event_ids):
            by_event = pc.is_in(table["event_id"], value_set=event_ids)
            who = by_event if who is None else pc.or_kleene(who, by_event)
        mask = pc.and_(mask, who) if who is not None else none
    return pc.fill_null(mask, False)


def _rewrite(lake: Lake, path: str, org_id: str, user_id: str | None, event_ids: pa.Array, rep: ForgetReport) -> int:
    with lake.fs.open(path, "rb") as f:
        table = pq.read_table(f)
    if table.num_rows == 0:
        return 0
    mask = _match(table, org_id, user_id, event_ids)
    n = pc.sum(mask).as_py() or 0
    if n == 0:
        return 0
    kept = table.filter(pc.invert(mask))
    if kept.num_rows == 0:
        lake.fs.rm(path)
        rep.files_deleted += 1
    else:
        lake.write_parquet(path[len(lake.base.rstrip("/")) + 1:], kept)
        rep.files_rewritten += 1
    return n


# --- CLI ------------------------------------------------------------------------------------------------
def add_forget(p: argparse.ArgumentParser) -> None:
    p.add_argument("--org", required=True, help="organisation whose rows are removed")
    p.add_argument("--user", default=None, help="only this user's rows (default: the whole organisation)")
    p.add_argument("--reason", default="data deletion request")
    p.set_defaults(run=_run)


def _run(args) -> int:
    cfg = load_config()
    rep = forget(lake_from_config(cfg), args.org, args.user, args.reason, wal_dir=cfg.wal_dir)
    print(json.dumps(asdict(rep), indent=2))
    return 0
