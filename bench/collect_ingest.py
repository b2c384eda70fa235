"""Benchmark: feedback events per second the collector makes durable (fsync before the ack).

    .venv/bin/python bench/collect_ingest.py [--n 20000] [--threads 32] [--http-n 4000]

Four paths, each counted only when acknowledged (fsynced): the WAL alone with many concurrent blocking
appenders (group commit), the WAL with many events in flight (futures, as the async gateway submits), the
gateway's /v1/feedback over real HTTP one event per request, and batches of 100 per request (the HTTP load
generator runs in a separate process). Then `compact` of everything into Parquet. Target (issue 23): >= 20,000
durable events/s with group commit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from rl_core.collect.collector import Collector  # noqa: E402
from rl_core.collect.compact import compact  # noqa: E402
from rl_core.collect.wal import WriteAheadLog  # noqa: E402
from rl_core.config import load_config  # noqa: E402
from rl_core.lake import Lake  # noqa: E402


def fb(event_id: str) -> dict:
    return {"feedback_id": str(uuid.uuid4()), "event_id": event_id, "org_id": "org-dev",
            "ts": datetime.now(timezone.utc).isoformat(), "kind": "thumbs", "value_bool": True,
            "value_float": None, "text": None}


def bench_wal(d: Path, n: int, threads: int) -> tuple[float, int]:
    w = WriteAheadLog(d)
    eid = str(uuid.uuid4())

    def run(k: int) -> None:
        for _ in range(k):
            w.append("feedback", fb(eid))

    ts = [threading.Thread(target=run, args=(n // threads,)) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    fsyncs = w.stats.fsyncs
    w.close()
    return (n // threads) * threads / dt, fsyncs


def bench_wal_in_flight(d: Path, n: int, in_flight: int) -> tuple[float, int]:
    """Events submitted as futures with up to `in_flight` unacknowledged at once, as the gateway's event loop
    does with concurrent requests (each request awaits its own future); counted when its future resolves."""
    w = WriteAheadLog(d)
    eid, pending = str(uuid.uuid4()), []
    t0 = time.perf_counter()
    for _ in range(n):
        pending.append(w.submit("feedback", fb(eid)))
        if len(pending) >= in_flight:
            pending.pop(0).result(30)
    for f in pending:
        f.result(30)
    dt = time.perf_counter() - t0
    fsyncs = w.stats.fsyncs
    w.close()
    return n / dt, fsyncs


def bench_http(base: str, event_ids: list[str], n: int, batch: int, concurrency: int) -> float:
    """Threads with one keep-alive connection each (httpx's async client was the bottleneck: ~75 req/s)."""
    headers = {"authorization": "Bearer rtrl-dev-token"}
    sent = [0]
    lock = threading.Lock()

    def worker(k: int) -> None:
        with httpx.Client(base_url=base, headers=headers, timeout=60) as c:
            for i in range(k):
                items = [{"event_id": event_ids[(i + j) % len(event_ids)], "kind": "thumbs", "value_bool": True}
                         for j in range(batch)]
                c.post("/v1/feedback", json=items if batch > 1 else items[0]).raise_for_status()
                with lock:
                    sent[0] += batch

    threads = [threading.Thread(target=worker, args=(n // batch // concurrency,)) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sent[0] / (time.perf_counter() - t0)


def http_in_subprocess(base: str, event_ids: list[str], n: int, batch: int, concurrency: int) -> float:
    """The load generator runs in its own process, so it does not share the gateway's GIL."""
    import json
    import subprocess

    out = subprocess.run([sys.executable, __file__, "--client", json.dumps([base, event_ids, n, batch, concurrency])],
                         check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        import json

        base, event_ids, n, batch, conc = json.loads(sys.argv[2])
        print(bench_http(base, event_ids, n, batch, conc))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--http-n", type=int, default=4000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--in-flight", type=int, default=1024, help="unacknowledged events at once (submit path)")
    a = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="rtrl-bench-collect-"))
    os.environ.update(RTRL_HOME=str(home), RTRL_PROFILE="tiny")
    cfg = load_config()
    rows = []

    rate, fsyncs = bench_wal(home / "wal-only", a.n, a.threads)
    rows.append(("WAL append, fsync before ack", f"{a.threads} threads, 1 event each", a.n, rate,
                 f"{a.n / fsyncs:.0f} events per fsync"))
    rate, fsyncs = bench_wal_in_flight(home / "wal-in-flight", a.n * 5, a.in_flight)
    rows.append(("WAL submit, fsync before ack", f"{a.in_flight} events in flight", a.n * 5, rate,
                 f"{a.n * 5 / fsyncs:.0f} events per fsync"))

    from rl_core.serving.app import create_app
    from rl_core.serving.router import Router
    from rl_core.serving.server import Gateway, serve_in_thread

    collector = Collector.from_config(cfg, background=False)
    event_ids = [str(uuid.uuid4()) for _ in range(100)]
    for e in event_ids:
        collector.index.add(e, "org-dev")
    router = Router(factory=lambda c, v: None, checkpoint_for=lambda v: Path("."), alias_source=dict,
                    challenger_share=0.1)  # no model needed for /v1/feedback
    gw = Gateway(create_app(cfg, router, collector), router, collector)
    with serve_in_thread(cfg, gateway=gw) as base:
        single = http_in_subprocess(base, event_ids, a.http_n, 1, a.concurrency)
        rows.append(("POST /v1/feedback over HTTP", f"{a.concurrency} concurrent clients, 1 event/request", a.http_n,
                     single, "uvicorn, 1 worker"))
        batched = http_in_subprocess(base, event_ids, a.http_n * 5, 100, 8)
        rows.append(("POST /v1/feedback over HTTP", "8 concurrent clients, 100 events/request", a.http_n * 5,
                     batched, "uvicorn, 1 worker"))
        collector.wal.roll()  # seal the live segment; compaction reads sealed ones
        t0 = time.perf_counter()
        r = compact(cfg.wal_dir, Lake(cfg.lake_root))
        dt = time.perf_counter() - t0
    rows.append(("compact WAL -> Parquet", f"{r.segments} segments", r.rows_written["feedback"],
                 r.rows_written["feedback"] / dt, "dedupe + zstd Parquet"))

    print("| path | load | events | events/s (durable) | note |")
    print("|---|---|---:|---:|---|")
    for path, load, n, rate, note in rows:
        print(f"| {path} | {load} | {n} | {rate:,.0f} | {note} |")
    print(f"\ntarget >= 20,000 durable events/s (group commit); measured on: {os.cpu_count()}-core machine")
    shutil.rmtree(home, ignore_errors=True)  # the write-ahead logs and the lake written above


if __name__ == "__main__":
    main()
