"""Collector: the gateway's handle on the durable log (WAL + event index + background compaction).

`log_*` return a concurrent Future that resolves once the event is fsynced; the gateway awaits it before
sending its 2xx. The index is updated before the append is submitted, so feedback that races its own
interaction is not refused; if the append fails, the request fails and the id stays harmlessly known.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from rl_core.collect.compact import CompactResult, compact
from rl_core.collect.index import EventIndex
from rl_core.collect.wal import WriteAheadLog
from rl_core.config import Config
from rl_core.lake import Lake

log = logging.getLogger("rtrl.collect")


class Collector:
    def __init__(self, wal_dir: str | Path, lake: Lake, segment_max_bytes: int, segment_max_age_s: float,
                 compact_interval_s: float | None = None):
        self.wal_dir = Path(wal_dir)
        self.lake = lake
        self.index = EventIndex.build(lake, self.wal_dir)
        self.wal = WriteAheadLog(self.wal_dir, segment_max_bytes, segment_max_age_s)
        self.compact_interval_s = compact_interval_s
        self.last_compaction: CompactResult | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if compact_interval_s:
            self._thread = threading.Thread(target=self._compact_loop, name="wal-compactor", daemon=True)
            self._thread.start()

    @classmethod
    def from_config(cls, cfg: Config, background: bool = True) -> Collector:
        s = cfg.serving
        return cls(cfg.wal_dir, Lake(cfg.lake_root), s.segment_max_bytes, s.segment_max_age_s,
                   s.compact_interval_s if background else None)

    # --- logging ----------------------------------------------------------------------------------
    def log_interaction(self, row: dict[str, Any]) -> Future:
        self.index.add(row["event_id"], row["org_id"])
        return self.wal.submit("interactions", row)

    def log_interactions(self, rows: list[dict[str, Any]]) -> Future:
        for r in rows:
            self.index.add(r["event_id"], r["org_id"])
        return self.wal.submit_many([("interactions", r) for r in rows])

    def log_feedback(self, rows: list[dict[str, Any]]) -> Future:
        return self.wal.submit_many([("feedback", r) for r in rows])

    # --- compaction -------------------------------------------------------------------------------
    def compact_now(self, roll: bool = True) -> CompactResult:
        """Seal the live segment (if asked) and compact everything sealed into the lake."""
        if roll:
            self.wal.roll()
        self.last_compaction = compact(self.wal_dir, self.lake)
        return self.last_compaction

    def _compact_loop(self) -> None:
        while not self._stop.wait(self.compact_interval_s):
            try:
                self.last_compaction = compact(self.wal_dir, self.lake)  # sealed segments only
            except Exception:  # keep serving; segments stay on disk for the next pass
                log.exception("background compaction failed")

    def close(self, final_compaction: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self.wal.close()
        if final_compaction:
            try:
                self.last_compaction = compact(self.wal_dir, self.lake)
            except Exception:
                log.exception("final compaction failed; segments are kept for the next run")
