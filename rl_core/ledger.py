"""The ledger of consumed episodes: which episodes a policy lineage has already trained on.

Why: a cycle's harvest is its window, and windows can overlap (a `make cycle` window inside a scheduled
one, a backfill over a window a manual run covered). Without a record, the second run harvests episodes the
first one already trained on and registers a near-copy of its version (seen: a scheduled run re-harvested a
manual run's 40 interactions and registered v4 with v2's training metrics). With it, an episode trains at
most once per lineage, whatever the windows.

Lineage: the root of a version's parent chain (`parent_version` tags up to a version without one: the base
`rtrl init` registered). Siblings (two updates of the same champion) and descendants (the next update of a
promoted challenger) share it, so neither trains on the episodes again. Episodes that made a version later
rolled back stay consumed: the same episodes, rewards and config would make the same update.

Layout: `ledger/consumed/model=<registered model>/root=<version>/<run_id>.parquet`, one file per run that
registered a version, holding its episodes' event_ids (LEDGER_SCHEMA), written atomically (Lake.write_bytes).

When: a run consumes its episodes when its version registers (rl_core/registry/register.py), not at harvest
or training: a run stopped by a gate, a crashed trainer or a dry run leaves them for a later run. The harvest
(sql/harvest.sql) leaves out episodes consumed by any *other* run, so a rerun of the same run id harvests
the same episodes and returns the version it already made. Two runs that harvested the same episodes before
either registered (concurrent windows) meet at registration: the second is refused (EpisodesConsumed).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from rl_core.config import Config
from rl_core.duck import bind_files, connect, load_sql
from rl_core.lake import Lake
from rl_core.registry import store
from rl_core.schema import LEDGER_SCHEMA


@dataclass(frozen=True)
class Lineage:
    """The versions descended from `root` in registered model `model`: one ledger between them."""

    model: str
    root: int

    @property
    def relpath(self) -> str:
        return f"ledger/consumed/model={self.model}/root={self.root}"

    def __str__(self) -> str:
        return f"{self.model} v{self.root}"


class EpisodesConsumed(RuntimeError):
    """A run's episodes were already trained on in its lineage by other runs: registering it would train
    them twice. `by` maps each of those runs to how many of the episodes it consumed."""

    def __init__(self, run_id: str, lineage: Lineage, by: dict[str, int]):
        self.run_id, self.lineage, self.by = run_id, lineage, by
        runs = ", ".join(f"{r} ({n})" for r, n in by.items())
        super().__init__(f"run {run_id}: {sum(by.values())} of its episodes were already trained on in lineage "
                         f"{lineage} by {runs}; not registering them a second time")


def lineage_of(cfg: Config, version: int) -> Lineage:
    """The lineage of a registered version: follow `parent_version` tags to the root."""
    seen: list[int] = []
    v = int(version)
    while v not in seen:
        seen.append(v)
        parent = store.get_version(cfg, v).tags.get("parent_version") or ""
        if not parent.strip().isdigit():  # the base version's parent_version is "none"
            return Lineage(cfg.mlflow.model_name, v)
        v = int(parent)
    raise ValueError(f"parent_version tags of {cfg.mlflow.model_name} form a cycle: {seen + [v]}")


def ledger_files(lake: Lake, lineage: Lineage | None) -> list[str]:
    return lake.list_files(lineage.relpath) if lineage is not None else []


def bind_consumed(con, lake: Lake, lineage: Lineage | None) -> None:
    """View `consumed` (LEDGER_SCHEMA) over the lineage's ledger (empty without a lineage: nothing excluded)."""
    bind_files(con, lake, "consumed", ledger_files(lake, lineage), LEDGER_SCHEMA)


def consumed_by_others(cfg: Config, run_id: str, lineage: Lineage) -> dict[str, int]:
    """{other run: how many of run_id's episodes it consumed} (sql/ledger/conflicts.sql)."""
    lake = Lake(cfg.lake_root)
    if not lake.exists(lake.run(run_id).episodes):
        return {}
    con = connect(lake, memory_limit=cfg.harvest.duckdb_memory_limit)
    try:
        ids = pa.schema([LEDGER_SCHEMA.field("event_id")])
        bind_files(con, lake, "episodes", [lake.path(lake.run(run_id).episodes)], ids)
        bind_consumed(con, lake, lineage)
        rows = con.execute(load_sql("ledger/conflicts.sql"), {"run_id": run_id}).fetchall()
    finally:
        con.close()
    return {r: int(n) for r, n in rows}


def consume(cfg: Config, run_id: str, version: int, parent_version: int) -> str | None:
    """Record run_id's episodes as consumed by `version` in its parent's lineage (idempotent: a run's file is
    written once). Returns the file's lake path (None for a run without episodes.parquet)."""
    lake = Lake(cfg.lake_root)
    lake.run(run_id)  # a plain name: it becomes a file name
    lineage = lineage_of(cfg, parent_version)
    relpath = f"{lineage.relpath}/{run_id}.parquet"
    if lake.exists(relpath):
        return lake.path(relpath)
    if not lake.exists(lake.run(run_id).episodes):
        return None
    with lake.fs.open(lake.path(lake.run(run_id).episodes), "rb") as f:  # the id column only, not the tokens
        ids = pq.read_table(f, columns=["event_id"]).column("event_id").combine_chunks()
    n = len(ids)
    table = pa.table({"event_id": ids, "run_id": pa.array([run_id] * n, pa.string()),
                      "version": pa.array([int(version)] * n, pa.int64()),
                      "parent_version": pa.array([int(parent_version)] * n, pa.int64())}, schema=LEDGER_SCHEMA)
    return lake.write_parquet(relpath, table)
