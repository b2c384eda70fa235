"""`rtrl simulate`: simulated users against a running gateway (or one started here on a free loopback port).

    rtrl simulate --users 20 --interactions 200 --rate 5            # starts the gateway in-process
    rtrl simulate --base-url http://127.0.0.1:8000 --rate 200 --concurrency 16   # drive `rtrl serve` (load)

Prints a markdown table (requests/s, latency p50/p90, what the turns were); exit 1 when any request failed.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from lab.simulate.bank import load_bank, select
from rl_core.config import Config, load_config


def add_simulate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--users", type=int, help="number of simulated users (default: [simulate] users)")
    p.add_argument("--interactions", type=int, help="total chat completions, at most")
    p.add_argument("--rate", type=float, help="requests per second, at most")
    p.add_argument("--concurrency", type=int, help="users in flight at once")
    p.add_argument("--max-seconds", type=float, help="stop after this many seconds")
    p.add_argument("--seed", type=int, help="random seed (same seed, same users and choices)")
    p.add_argument("--max-tokens", type=int, help="max_tokens per request")
    p.add_argument("--base-url", help="a running gateway (loopback only); default: start one in-process")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=_run)


def _run(args) -> int:
    from lab.simulate.runner import SimSpec, check_loopback, simulate  # lazy: keeps rtrl --help fast (pyarrow)

    cfg = load_config()
    try:
        spec = SimSpec.from_config(cfg, users=args.users, interactions=args.interactions, rate=args.rate,
                                   concurrency=args.concurrency, max_seconds=args.max_seconds, seed=args.seed,
                                   max_tokens=args.max_tokens)
        if args.base_url:
            check_loopback(args.base_url)
        select(load_bank(), cfg.simulate.tasks)  # a bad task id stops us before a gateway starts
    except ValueError as exc:
        print(f"rtrl simulate: {exc}", file=sys.stderr)
        return 2
    with _gateway(cfg, args.base_url) as url:
        report = simulate(cfg, url, spec, progress=not args.no_progress)
    print(report.table())
    for line in report.error_examples:
        print(f"error: {line}", file=sys.stderr)
    return 1 if report.errors else 0


@contextlib.contextmanager
def _gateway(cfg: Config, base_url: str | None):
    if base_url:
        yield base_url
        return
    from rl_core.serving.server import serve_in_thread  # lazy: heavy (fastapi, uvicorn)

    with serve_in_thread(cfg, port=0) as url:
        yield url
