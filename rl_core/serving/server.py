"""Assemble and run the gateway: router (MLflow aliases -> backends) + collector (WAL -> lake) + app.

`serve_in_thread(cfg, port=0)` is the handle for tests of other parts: it serves the registry's
champion/challenger on 127.0.0.1 in this process and yields the base URL; the OpenAI base_url is
base + "/v1". Everything (engines, WAL, compaction) is closed on exit, with a final compaction, so
the lake holds every acknowledged event afterwards.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

from rl_core.collect.collector import Collector
from rl_core.config import Config
from rl_core.registry import store
from rl_core.runtime.procs import private_state
from rl_core.serving.app import create_app
from rl_core.serving.backends import make_backend
from rl_core.serving.router import Router

log = logging.getLogger("rtrl.serving")


@dataclass
class Gateway:
    app: FastAPI
    router: Router
    collector: Collector

    closed: bool = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.router.close()
        self.collector.close()


def build_gateway(cfg: Config, backend: str | None = None, poll: bool = True, background_compaction: bool = True) -> Gateway:
    """Load what the aliases point at (blocking) and wire the app. backend overrides cfg.serving.backend."""
    kind = backend or cfg.serving.backend
    from rl_core.orgs.serving import AdapterPool  # lazy: heavy (the orgs modules)

    adapters = AdapterPool(cfg)  # per-org LoRA adapters: in their base's vLLM engine (multi-LoRA), else peft-merged
    router = Router(
        factory=lambda ckpt, version: make_backend(kind, ckpt, cfg, version),
        checkpoint_for=lambda version: store.checkpoint_path(cfg, version),
        alias_source=lambda: store.aliases(cfg),
        challenger_share=cfg.serving.challenger_share,
        model_name=cfg.mlflow.model_name,
        poll_s=cfg.serving.alias_poll_s,
        adapters=adapters,
        spares=cfg.serving.spare_engines,
        prewarm=cfg.serving.prewarm_spare,
    )
    collector = Collector.from_config(cfg, background=background_compaction)
    try:
        router.start(background=poll)
    except Exception:
        collector.close()
        raise
    return Gateway(create_app(cfg, router, collector), router, collector)


class _ThreadServer(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # signals belong to the main thread's owner
        pass


@contextlib.contextmanager
def serve_in_thread(cfg: Config, port: int = 0, backend: str | None = None, gateway: Gateway | None = None) -> Iterator[str]:
    """Serve on 127.0.0.1:port (0 = a free port) in a thread; yields "http://127.0.0.1:PORT"."""
    gw = gateway or build_gateway(cfg, backend)
    server = _ThreadServer(uvicorn.Config(gw.app, host="127.0.0.1", port=port, log_level="warning",
                                          timeout_graceful_shutdown=30))
    thread = threading.Thread(target=server.run, name="rtrl-gateway", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway did not start")
            time.sleep(0.02)
        bound = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        gw.close()


class _ClosingServer(uvicorn.Server):
    """Closes the gateway (engines, WAL, final compaction) inside shutdown: uvicorn re-raises SIGTERM
    once serve() returns, so code after uvicorn.run would never run."""

    def __init__(self, config: uvicorn.Config, gateway: Gateway):
        super().__init__(config)
        self.gateway = gateway

    async def shutdown(self, sockets=None) -> None:
        await super().shutdown(sockets)
        self.gateway.close()


def run(cfg: Config, host: str, port: int, backend: str | None = None) -> None:
    """Serve in the foreground until SIGINT/SIGTERM, then drain requests and close everything. The WAL and the
    lake partitions it writes hold every org's raw traffic: they are this user's alone (umask 077)."""
    private_state(cfg)
    gw = build_gateway(cfg, backend)
    try:
        _ClosingServer(uvicorn.Config(gw.app, host=host, port=port, log_level="info", timeout_graceful_shutdown=30),
                       gw).run()
    finally:
        gw.close()  # idempotent; reached when serving stops without a signal
