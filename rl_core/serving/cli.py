"""`rtrl serve --host H --port P`: serve the MLflow `champion`/`challenger` (after `rtrl init`)."""

from __future__ import annotations

import argparse
import logging

from rl_core.config import load_config


def add_serve(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=None, help="bind address (default: [serving] host)")
    p.add_argument("--port", type=int, default=None, help="port (default: [serving] port)")
    p.add_argument("--backend", choices=["auto", "vllm", "transformers"], default=None,
                   help="engine (default: [serving] backend)")
    p.set_defaults(run=_run)


def _run(args) -> int:
    from rl_core.registry import store  # lazy: keeps rtrl --help fast (pyarrow, fastapi)
    from rl_core.serving.server import run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per engine call: noise, and CPU beside the engine
    cfg = load_config()
    if store.version_for_alias(cfg, "champion") is None:
        print(f"rtrl serve: no `champion` alias in {cfg.tracking_uri}; run `rtrl init` first")
        return 2
    run(cfg, args.host or cfg.serving.host, args.port or cfg.serving.port, args.backend)
    return 0
