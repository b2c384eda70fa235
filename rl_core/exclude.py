"""The exclude stage: drop the episodes of an org that gate_raw quarantined, before anything downstream reads them.

gate_raw judges one org's bad rows without refusing every org's window (rl_core/quality/gates.py says when):
it names that org in its verdict's details["quarantined"] and passes the rest. A gate only judges, so the act
is here, the stage right after it (pipeline.CYCLE): runs/<run_id>/episodes.parquet is rewritten without that
org's episodes (streamed, atomic) and harvest.json's counts follow, with `quarantined_orgs` named. A rerun finds
nothing left to drop and writes nothing; a window with no quarantined org is left as it is.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rl_core.config import Config
from rl_core.duck import write_stream
from rl_core.harvest import episodes_path, read_manifest
from rl_core.lake import Lake
from rl_core.reports import read_verdict
from rl_core.schema import EPISODES_SCHEMA


def quarantined_orgs(lake: Lake, run_id: str) -> list[str]:
    """The orgs gate_raw's verdict quarantined for this run (none when it has not judged or passed whole)."""
    verdict = read_verdict(lake, run_id, "gate_raw")
    if verdict is None or not verdict.passed:
        return []
    return sorted((verdict.details or {}).get("quarantined", {}))


def exclude(cfg: Config, run_id: str) -> int:
    """Drop the quarantined orgs' episodes from the run; returns how many were dropped (0: none to drop)."""
    lake = Lake(cfg.lake_root)
    orgs = quarantined_orgs(lake, run_id)
    path = episodes_path(lake, run_id)
    if not orgs or not lake.exists(path):
        return 0
    drop = pa.array(orgs, pa.string())
    with lake.fs.open(lake.path(path), "rb") as f:
        org_col = pq.read_table(f, columns=["org_id"])["org_id"]
        n_drop = int(pc.sum(pc.is_in(org_col, value_set=drop)).as_py() or 0)
    if n_drop == 0:
        return 0
    with lake.fs.open(lake.path(path), "rb") as f:
        batches = (b.filter(pc.invert(pc.fill_null(pc.is_in(b["org_id"], value_set=drop), False)))
                   for b in pq.ParquetFile(f).iter_batches(batch_size=65_536))
        _, n_rows, n_fb = write_stream(lake, path, batches, EPISODES_SCHEMA)
    manifest = read_manifest(lake, run_id)
    if manifest is not None:
        manifest |= {"n_episodes": n_rows, "n_with_feedback": n_fb, "quarantined_orgs": orgs,
                     "n_quarantined": manifest.get("n_quarantined", 0) + n_drop}
        lake.write_json(lake.run(run_id).manifest, manifest)
    return n_drop
