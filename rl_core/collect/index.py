"""Which interactions exist (event_id -> org_id), so feedback for an unknown event is refused with 404.

Built at startup from the lake's interaction partitions (only two columns are read) and from the
write-ahead segments not yet compacted, then kept current by the collector on every append. An event of
another organisation counts as unknown: a token never learns about another org's events.
Memory: ~150 bytes per event, i.e. ~150 MB per million interactions; a production fleet with a longer
history would back this with a key-value store.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pyarrow.parquet as pq

from rl_core.collect import wal
from rl_core.lake import Lake


class EventIndex:
    def __init__(self) -> None:
        self._orgs: dict[str, str] = {}
        self._lock = threading.Lock()

    def add(self, event_id: str, org_id: str) -> None:
        with self._lock:
            self._orgs[event_id] = sys.intern(org_id)

    def org_of(self, event_id: str) -> str | None:
        return self._orgs.get(event_id)

    def known(self, event_id: str, org_id: str) -> bool:
        return self._orgs.get(event_id) == org_id

    def __len__(self) -> int:
        return len(self._orgs)

    @classmethod
    def build(cls, lake: Lake, wal_dir: str | Path) -> "EventIndex":
        idx = cls()  # segments first, lake second: a segment compacted in between is in the lake
        for seg in [*wal.sealed_segments(wal_dir), *wal.open_segments(wal_dir)]:
            try:
                for kind, row in wal.read_segment(seg):
                    if kind == "interactions":
                        idx._orgs[row["event_id"]] = sys.intern(row["org_id"])
            except FileNotFoundError:  # compacted meanwhile: its rows are in the lake read below
                continue
        for path in lake.list_files("raw/interactions"):
            with lake.fs.open(path, "rb") as f:
                t = pq.read_table(f, columns=["event_id", "org_id"])
            for e, o in zip(t.column("event_id").to_pylist(), t.column("org_id").to_pylist(), strict=True):
                idx._orgs[e] = sys.intern(o)
        return idx
