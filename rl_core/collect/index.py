"""Which interactions exist (event_id -> org_id), so feedback for an unknown event is refused with 404.

Built at startup from the lake's interaction partitions (only two columns are read) and from the
write-ahead segments not yet compacted, then kept current by the collector on every append. An event of
another organisation counts as unknown: a token never learns about another org's events.
Memory: ~150 bytes per event, i.e. ~150 MB per million interactions; a production fleet with a longer
history would back this with a key-value store.
Forgotten subjects (`rtrl forget`) are not indexed, and `prune` removes them once a request is recorded
(the collector syncs with forget/registry.json and forget/tombstones.json after each compaction pass), so
feedback on a forgotten user's interaction is refused like feedback on an unknown one.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

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

    def prune(self, event_ids: Iterable[str] = (), orgs: Iterable[str] = ()) -> int:
        """Forget these events and every event of these orgs; returns how many entries went."""
        orgs = set(orgs)
        with self._lock:
            before = len(self._orgs)
            for e in event_ids:
                self._orgs.pop(e, None)
            if orgs:
                self._orgs = {e: o for e, o in self._orgs.items() if o not in orgs}
            return before - len(self._orgs)

    @classmethod
    def build(cls, lake: Lake, wal_dir: str | Path,
              forgotten: Callable[[Any, Any], bool] | None = None) -> "EventIndex":
        """From the WAL and the lake; `forgotten(org_id, user_id)` true: the WAL row is left out."""
        idx = cls()  # segments first, lake second: a segment compacted in between is in the lake; open ones
        # listed before sealed ones, so one sealed between the two listings is read under its sealed name
        for seg in [*wal.open_segments(wal_dir), *wal.sealed_segments(wal_dir)]:
            try:
                for kind, row in wal.read_segment(seg):
                    if kind != "interactions" or not isinstance(row, dict):
                        continue
                    e, o = row.get("event_id"), row.get("org_id")
                    if isinstance(e, str) and isinstance(o, str) and not (forgotten and forgotten(o, row.get("user_id"))):
                        idx._orgs[e] = sys.intern(o)
            except FileNotFoundError:  # compacted meanwhile: its rows are in the lake read below
                continue
        for path in lake.list_files("raw/interactions"):
            with lake.fs.open(path, "rb") as f:
                t = pq.read_table(f, columns=["event_id", "org_id"])
            for e, o in zip(t.column("event_id").to_pylist(), t.column("org_id").to_pylist(), strict=True):
                idx._orgs[e] = sys.intern(o)
        return idx
