"""Collector: the gateway's handle on the durable log (WAL + event index + background compaction).

`log_*` return a concurrent Future that resolves once the event is fsynced; the gateway awaits it before
sending its 2xx. The index is updated before the append is submitted, so feedback that races its own
interaction is not refused; if the append fails, the request fails and the id stays harmlessly known.
After each compaction pass the collector syncs with `rtrl forget` (run by any process): the index drops the
forgotten subjects' events and new interactions of theirs are not indexed (their feedback is then refused;
what reaches the WAL meanwhile is dropped by compaction). `health()` is what /healthz and /metrics report
of the data plane: quarantined rows (counted in the lake, so another process's compaction shows too), the
last error, compaction failures, the WAL backlog (`rtrl collect status` reads the same from the lake).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from rl_core.collect import quarantine, wal
from rl_core.collect.compact import CompactResult, compact
from rl_core.collect.index import EventIndex
from rl_core.collect.quarantine import QuarantineStatus, reason_of
from rl_core.collect.wal import WriteAheadLog
from rl_core.config import Config
from rl_core.forget import ForgetRules, load_registry, load_tombstones
from rl_core.lake import Lake

log = logging.getLogger("rtrl.collect")


class Collector:
    def __init__(self, wal_dir: str | Path, lake: Lake, segment_max_bytes: int, segment_max_age_s: float,
                 compact_interval_s: float | None = None):
        self.wal_dir = Path(wal_dir)
        self.lake = lake
        self.rules = ForgetRules(load_registry(lake))
        self._forget_seen: tuple | None = None
        self._pruned_orgs: set[str] = set()
        self.index = EventIndex.build(lake, self.wal_dir, self.rules.covers)
        self.sync_forgets()
        self.wal = WriteAheadLog(self.wal_dir, segment_max_bytes, segment_max_age_s)
        self.compact_interval_s = compact_interval_s
        self.last_compaction: CompactResult | None = None
        self.quarantine: QuarantineStatus = quarantine.status(lake)
        self.compaction_failures = 0
        self.last_compaction_error: str | None = None  # of the last pass, None once a pass succeeds
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
        self._index(row)
        return self.wal.submit("interactions", row)

    def log_interactions(self, rows: list[dict[str, Any]]) -> Future:
        for r in rows:
            self._index(r)
        return self.wal.submit_many([("interactions", r) for r in rows])

    def _index(self, row: dict[str, Any]) -> None:
        """Known to the feedback route, unless its subject is forgotten (then compaction drops it too)."""
        if not self.rules.covers(row["org_id"], row.get("user_id")):
            self.index.add(row["event_id"], row["org_id"])

    def log_feedback(self, rows: list[dict[str, Any]]) -> Future:
        return self.wal.submit_many([("feedback", r) for r in rows])

    # --- compaction -------------------------------------------------------------------------------
    def compact_now(self, roll: bool = True) -> CompactResult:
        """Seal the live segment (if asked) and compact everything sealed into the lake."""
        if roll:
            self.wal.roll()
        return self._compact()

    def _compact(self) -> CompactResult:
        """One pass (sealed segments only), then the state health() reports and the forget sync."""
        try:
            result = compact(self.wal_dir, self.lake)
        except Exception as exc:
            self.compaction_failures += 1
            self.last_compaction_error = reason_of(exc)
            raise
        self.last_compaction, self.last_compaction_error = result, None
        self.quarantine = quarantine.status(self.lake)
        self.sync_forgets()
        return result

    def _compact_loop(self) -> None:
        while not self._stop.wait(self.compact_interval_s):
            try:
                self._compact()
            except Exception:  # keep serving; segments stay on disk for the next pass
                log.exception("background compaction failed")

    # --- data rights and health -------------------------------------------------------------------
    def sync_forgets(self) -> int:
        """Catch up with forget requests recorded since the last sync (by any process): prune the index of
        the forgotten subjects' events. Returns the entries pruned."""
        registry, tombstones = load_registry(self.lake), load_tombstones(self.lake)
        seen = (tuple(r.get("request_id") for r in registry), len(tombstones))
        if seen == self._forget_seen:
            return 0
        self.rules = ForgetRules(registry)
        pruned = self.index.prune(tombstones, self.rules.orgs - self._pruned_orgs)  # a whole org: one scan, once
        self._pruned_orgs |= self.rules.orgs
        self._forget_seen = seen
        return pruned

    def health(self) -> dict[str, Any]:
        """The data plane as /healthz and /metrics report it."""
        q = self.quarantine
        return {"quarantined": q.count, "last_quarantine_error": q.last_error, "last_quarantined_at": q.last_at,
                "compaction_failures": self.compaction_failures, "last_compaction_error": self.last_compaction_error,
                "wal_sealed_backlog": len(wal.sealed_segments(self.wal_dir))}

    def close(self, final_compaction: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self.wal.close()
        if final_compaction:
            try:
                self._compact()
            except Exception:
                log.exception("final compaction failed; segments are kept for the next run")
