"""Simulated users against the real gateway (tiny model, transformers backend) over HTTP with the openai SDK:
what they send ends up in the lake as interactions + feedback, org from the token, and `rtrl simulate` works."""

from __future__ import annotations

from datetime import timedelta

import pyarrow.compute as pc
import pytest

from lab.simulate.runner import SimSpec, simulate
from rl_core.lake import Lake
from rl_core.schema import now_utc


@pytest.fixture
def gateway(registered):
    from rl_core.serving.server import build_gateway, serve_in_thread

    gw = build_gateway(registered)
    with serve_in_thread(registered, gateway=gw) as url:
        yield registered, gw, url


def test_users_drive_the_gateway_and_their_events_reach_the_lake(gateway, capsys, monkeypatch):
    cfg, gw, url = gateway
    t0 = now_utc()
    spec = SimSpec.from_config(cfg, users=3, interactions=6, rate=50.0, concurrency=2, max_tokens=16, seed=3)
    report = simulate(cfg, url, spec, progress=False)
    assert report.errors == 0, report.error_examples
    assert report.interactions == 6 and report.sessions >= 3 and report.versions == {1: 6}
    assert sum(report.outcomes.values()) == 6
    gw.collector.compact_now()
    lake = Lake(cfg.lake_root)
    inter = lake.read_window("interactions", t0.replace(minute=0), now_utc().replace(minute=59))
    assert inter is not None and inter.num_rows == 6
    users = set(inter.column("user_id").to_pylist())
    assert users <= {"org-acme-u000", "org-globex-u001", "org-acme-u002"} and len(users) == 3
    orgs = dict(zip(inter.column("user_id").to_pylist(), inter.column("org_id").to_pylist(), strict=True))
    assert all(orgs[u] == u.rsplit("-u", 1)[0] for u in users)  # the org came from each user's token
    assert set(inter.column("model_version").to_pylist()) == {1}
    # every session got a session_end; feedback with future timestamps (delayed outcomes) is kept too
    feed = lake.read_window("feedback", t0.replace(minute=0), t0 + timedelta(hours=8))
    assert feed is not None and feed.num_rows == report.feedback
    assert set(feed.column("event_id").to_pylist()) <= set(inter.column("event_id").to_pylist())
    kinds = feed.column("kind").to_pylist()
    assert kinds.count("session_end") == report.sessions
    assert pc.all(pc.is_in(feed.column("org_id"), pc.unique(inter.column("org_id")))).as_py()

    # `rtrl simulate` against the same running gateway (one gateway per test: model load is the cost)
    from rl_core.cli import main

    rc = main(["simulate", "--base-url", url + "/v1", "--users", "2", "--interactions", "3", "--rate", "20",
               "--max-tokens", "8", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "| interactions | 3 |" in out and "| errors | 0 |" in out
    assert main(["simulate", "--base-url", "http://10.0.0.1:8000", "--users", "1"]) == 2
    assert "loopback" in capsys.readouterr().err
    monkeypatch.setenv("RTRL_SIMULATE__TASKS", '["sim-add", "sim-nope"]')
    assert main(["simulate", "--base-url", url + "/v1", "--users", "1"]) == 2
    assert "simulate.tasks: unknown task id(s) ['sim-nope']" in capsys.readouterr().err
