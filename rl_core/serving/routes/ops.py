"""For operators, without auth: GET /healthz (503 until a champion serves) and GET /metrics (Prometheus).

Both report the data plane too (Collector.health()): rows quarantined by compaction, the newest one's
reason, compaction failures and the WAL backlog. A quarantined row does not make the gateway unready:
serving and every other event's ingestion go on; the operator sees the count and the reason.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from rl_core.serving.routes.deps import Parts

api = APIRouter()


@api.get("/healthz")
async def healthz(gw: Parts) -> JSONResponse:
    """Ready once a champion is loaded: a load balancer sends no traffic before (503)."""
    router = gw.router
    body = {"ready": router.ready, "serving": router.versions(), "last_error": router.last_error,
            "collect": gw.collector.health()}
    return JSONResponse(body, status_code=200 if router.ready else 503)


@api.get("/metrics")
async def metrics_text(gw: Parts) -> Response:
    """Refresh the gauges that mirror other parts' state (aliases, WAL, index), then render them all."""
    m, collector = gw.metrics, gw.collector
    m.served.clear()  # an alias that was removed (rollback) must not linger
    for alias, v in gw.router.versions().items():
        m.served.labels(alias).set(v)
    m.wal_fsyncs.set(collector.wal.stats.fsyncs)
    m.wal_segments.set(collector.wal.stats.segments_sealed)
    m.index_size.set(len(collector.index))
    m.set_collect(collector.health())
    return Response(m.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
