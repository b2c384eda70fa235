"""Crash safety: events sent concurrently, the gateway SIGKILLed mid-stream and restarted; every event
that got a 2xx is in the lake after compaction, exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from rl_core.lake import Lake
from rl_core.runtime.procs import free_port

REPO = Path(__file__).resolve().parent.parent
AUTH = {"authorization": "Bearer rtrl-dev-token"}


def start_gateway(port: int, log: Path) -> subprocess.Popen:
    env = dict(os.environ, RTRL_SERVING__COMPACT_INTERVAL_S="1", RTRL_SERVING__SEGMENT_MAX_BYTES="20000")
    with open(log, "ab") as f:
        proc = subprocess.Popen([sys.executable, "-m", "rl_core.cli", "serve", "--host", "127.0.0.1", "--port",
                                 str(port), "--backend", "transformers"], cwd=REPO, env=env, stdout=f,
                                stderr=subprocess.STDOUT)
    deadline = time.time() + 150
    while time.time() < deadline:
        assert proc.poll() is None, f"gateway exited: {log.read_text()[-2000:]}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise TimeoutError(log.read_text()[-2000:])


def interaction() -> dict:
    now = datetime.now(timezone.utc).isoformat()
    return {"event_id": str(uuid.uuid4()), "user_id": "u", "session_id": "s", "ts_request": now, "ts_response": now,
            "requested_model": "auto", "model_version": 1, "arm": "champion", "messages": [],
            "prompt_token_ids": [1], "completion_token_ids": [2], "completion_logprobs": [-0.5]}


@pytest.mark.slow
def test_sigkill_mid_stream_loses_no_acknowledged_event(registered, tmp_path):
    cfg = registered
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_gateway(port, tmp_path / "gw.log")
    acked_events: set[str] = set()
    acked_feedback: set[str] = set()
    lock = threading.Lock()
    dead = threading.Event()

    def client() -> None:
        with httpx.Client(base_url=base, headers=AUTH, timeout=10) as c:
            while not dead.is_set():
                try:
                    ev = interaction()
                    if c.post("/v1/interactions", json=ev).status_code == 200:
                        with lock:
                            acked_events.add(ev["event_id"])
                        fb = {"feedback_id": str(uuid.uuid4()), "event_id": ev["event_id"], "kind": "thumbs",
                              "value_bool": True}
                        if c.post("/v1/feedback", json=[fb, {**fb, "feedback_id": str(uuid.uuid4()),
                                                             "kind": "edit_applied"}]).status_code == 200:
                            with lock:
                                acked_feedback.add(fb["feedback_id"])
                    r = c.post("/v1/chat/completions", json={"model": "auto", "max_tokens": 4,
                                                             "messages": [{"role": "user", "content": "x"}]})
                    if r.status_code == 200:
                        with lock:
                            acked_events.add(r.headers["x-rtrl-event-id"])
                except httpx.HTTPError:
                    time.sleep(0.01)

    threads = [threading.Thread(target=client) for _ in range(6)]
    for t in threads:
        t.start()
    time.sleep(3.0)
    n_before_kill = len(acked_events)
    proc.send_signal(signal.SIGKILL)  # mid-stream: clients are still sending
    proc.wait()
    time.sleep(0.3)
    dead.set()
    for t in threads:
        t.join()
    assert n_before_kill > 20, "the clients were sending when the gateway died"
    from rl_core.collect import wal

    assert wal.open_segments(cfg.wal_dir), "the dead gateway left an unsealed segment to recover"

    proc = start_gateway(port, tmp_path / "gw.log")  # restarted: rebuilds its index from WAL + lake
    try:
        some = next(iter(acked_events))
        r = httpx.post(base + "/v1/feedback", headers=AUTH, json={"event_id": some, "kind": "session_end"})
        assert r.status_code == 200, "an event acknowledged before the crash is still known after it"
    finally:
        proc.send_signal(signal.SIGTERM)  # graceful: drains, closes the WAL, compacts it
        proc.wait(timeout=60)
    assert not wal.open_segments(cfg.wal_dir) and not wal.sealed_segments(cfg.wal_dir), \
        "a graceful stop leaves nothing uncompacted"
    lake = Lake(cfg.lake_root)
    events = [e for p in lake.list_files("raw/interactions") for e in pq.read_table(p).column("event_id").to_pylist()]
    fbs = [f for p in lake.list_files("raw/feedback") for f in pq.read_table(p).column("feedback_id").to_pylist()]
    assert acked_events <= set(events), f"{len(acked_events - set(events))} acknowledged interactions were lost"
    assert acked_feedback <= set(fbs), f"{len(acked_feedback - set(fbs))} acknowledged feedback events were lost"
    assert len(events) == len(set(events)) and len(fbs) == len(set(fbs)), "each event is stored exactly once"
    print(f"\nacknowledged {len(acked_events)} interactions + {len(acked_feedback)} feedback pairs; all in the lake once")
