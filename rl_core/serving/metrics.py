"""Prometheus metrics of one gateway (own registry, so two gateways in one process never collide)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

MAX_LABEL = 200  # characters of an error text kept in a label
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("rtrl_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.completions = Counter("rtrl_completions", "completions served", ["arm", "version"], registry=r)
        self.completion_tokens = Counter("rtrl_completion_tokens", "completion tokens", ["arm", "version"], registry=r)
        self.latency = Histogram("rtrl_completion_latency_seconds", "request to last token", ["arm"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.ack = Histogram("rtrl_wal_ack_seconds", "time an event waits to be durable (fsync)",
                             buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5), registry=r)
        self.logging = Histogram("rtrl_completion_logging_seconds", "what logging adds to a completion: row + fsync",
                                 buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5), registry=r)
        self.events = Counter("rtrl_events_logged", "events acknowledged durably", ["kind"], registry=r)
        self.served = Gauge("rtrl_alias_version", "version each alias serves", ["alias"], registry=r)
        self.wal_fsyncs = Gauge("rtrl_wal_fsyncs", "fsyncs by the WAL writer (group commits)", registry=r)
        self.wal_segments = Gauge("rtrl_wal_segments_sealed", "WAL segments sealed", registry=r)
        self.index_size = Gauge("rtrl_event_index_size", "interactions known to the feedback index", registry=r)
        self.quarantined = Gauge("rtrl_quarantined_rows", "WAL rows compaction could not write (quarantine/)",
                                 registry=r)
        self.quarantined_at = Gauge("rtrl_quarantine_last_timestamp_seconds", "when the newest row was quarantined",
                                    registry=r)
        self.compaction_failures = Gauge("rtrl_compaction_failures", "compaction passes that failed", registry=r)
        self.wal_backlog = Gauge("rtrl_wal_sealed_backlog", "sealed WAL segments waiting for compaction", registry=r)
        self.last_error = Gauge("rtrl_collect_last_error_info", "the data plane's last error (1 while there is one)",
                                ["source", "error"], registry=r)

    def set_collect(self, h: dict[str, Any]) -> None:
        """Mirror Collector.health(); the error text is a label, cut short (the client escapes it)."""
        self.quarantined.set(h["quarantined"])
        at = h.get("last_quarantined_at")
        self.quarantined_at.set(datetime.fromisoformat(at).timestamp() if at else 0)
        self.compaction_failures.set(h["compaction_failures"])
        self.wal_backlog.set(h["wal_sealed_backlog"])
        self.last_error.clear()
        for source, key in (("quarantine", "last_quarantine_error"), ("compaction", "last_compaction_error")):
            if h.get(key):
                self.last_error.labels(source, h[key][:MAX_LABEL]).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)
