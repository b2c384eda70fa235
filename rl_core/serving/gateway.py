"""The gateway as a child process of `rtrl cycle` / `rtrl experiment`, and how to tell it has caught up.

Why a long-lived gateway: in production the gateway stays up and follows the MLflow aliases (the router
polls them and swaps weights in place), so a cycle pays no engine start-up. `rtrl experiment` runs its
cycles the same way: one gateway for all of them. Two things then need waiting for instead of a restart:
- the gateway serves what the registry says (a deploy or rollback moved an alias during the last DAG run);
- every event the simulated users got acknowledged is in a sealed WAL segment, so compaction can take it
  (the live segment seals by age: the experiment's gateway runs with a short serving.segment_max_age_s).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from rl_core.collect.wal import open_segments, try_seal_orphan
from rl_core.config import Config
from rl_core.registry import store
from rl_core.runtime.procs import free_port, start, stop, wait_http
from rl_core.serving.router import ALIASES


def start_gateway(cfg: Config, env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    """`rtrl serve` on a free loopback port; returns (process, base URL) once /healthz answers."""
    port = free_port()
    proc = start([sys.executable, "-m", "rl_core.cli", "serve", "--host", "127.0.0.1", "--port", str(port)], env, log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/healthz", cfg.serving.vllm_startup_timeout_s + 120, proc, log)
    except BaseException:
        stop(proc)
        raise
    return proc, url


def serving(base_url: str) -> dict[str, int]:
    """alias -> version the gateway serves now (its /healthz)."""
    try:
        with urllib.request.urlopen(f"{base_url}/healthz", timeout=5) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as exc:  # 503 while no champion is loaded: the body still says what is
        body = json.loads(exc.read() or b"{}")
    return {a: int(v) for a, v in (body.get("serving") or {}).items()}


def wait_in_sync(cfg: Config, base_url: str, timeout_s: float) -> dict[str, int]:
    """Block until the gateway serves exactly the registry's champion/challenger aliases; returns them."""
    deadline = time.monotonic() + timeout_s
    while True:
        wanted = {a: int(v) for a, v in store.aliases(cfg).items() if a in ALIASES}
        try:
            now: dict[str, int] | str = serving(base_url)
        except OSError as exc:  # not listening (yet), or gone
            now = f"is unreachable ({exc})"
        if now == wanted:
            return now
        if time.monotonic() > deadline:
            said = now if isinstance(now, str) else f"serves {now}"
            raise TimeoutError(f"the gateway at {base_url} {said}, the registry says {wanted} "
                               f"(after {timeout_s:.0f}s)")
        time.sleep(0.5)


def wait_wal_sealed(wal_dir: str | Path, timeout_s: float) -> None:
    """Block until no WAL segment is open (the live one sealed by age): every acknowledged event is then
    in a segment that compaction takes."""
    deadline = time.monotonic() + timeout_s
    # a segment nobody holds is a crashed writer's: seal it (as compaction would) rather than wait for it
    while [p for p in open_segments(wal_dir) if try_seal_orphan(p) is None and p.exists()]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"a WAL segment in {wal_dir} is still open after {timeout_s:.0f}s: "
                               "is serving.segment_max_age_s longer than the wait?")
        time.sleep(0.2)
