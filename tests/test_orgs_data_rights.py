"""Data rights in harvest: opted-out orgs, forgotten orgs/users (even rows landing after the request), org filter."""

from __future__ import annotations

from datetime import timedelta

import pytest

from lab.testing.synth import feedback_row, interaction_row, window
from rl_core.forget import forget
from rl_core.harvest import harvest
from rl_core.lake import Lake
from rl_core.schema import to_table

START, END = window()


def land(lake: Lake, rows: list[dict]) -> None:
    """Write interactions (each with one thumbs feedback) as the collector would."""
    for r in rows:
        lake.write_partition("interactions", r["ts_request"], to_table("interactions", [r]))
        lake.write_partition("feedback", r["ts_request"], to_table("feedback", [feedback_row(r, "thumbs", value_bool=True)]))


def traffic(t) -> list[dict]:
    who = [("org-a", "u1"), ("org-a", "u2"), ("org-b", "u1"), ("org-c", "u9")]
    return [interaction_row(t + timedelta(minutes=i), org_id=o, user_id=u, session_id=f"s-{o}-{u}")
            for i, (o, u) in enumerate(who)]


def harvested(cfg, run_id: str) -> list[tuple[str, str]]:
    t = Lake(cfg.lake_root).read_parquet(f"runs/{run_id}/episodes.parquet")
    return sorted(zip(t["org_id"].to_pylist(), t["user_id"].to_pylist(), strict=True))


def test_opt_out_org_is_never_harvested(cfg):
    land(Lake(cfg.lake_root), traffic(START + timedelta(hours=1)))
    cfg.harvest.opt_out_orgs = ["org-b"]
    r = harvest(cfg, START, END, 1, "run-opt")
    assert harvested(cfg, "run-opt") == [("org-a", "u1"), ("org-a", "u2"), ("org-c", "u9")]
    assert (r.n_interactions, r.n_episodes, r.n_excluded, r.n_stale) == (4, 3, 1, 0)
    manifest = Lake(cfg.lake_root).read_json("runs/run-opt/harvest.json")
    assert manifest["opt_out_orgs"] == ["org-b"] and manifest["excluded_rules"] == 1
    # per-org harvest of an opted-out org: nothing, whatever the filter says
    assert harvest(cfg, START, END, 1, "run-opt-b", org_id="org-b").n_episodes == 0
    cfg.harvest.opt_out_orgs = []
    assert harvest(cfg, START, END, 1, "run-opt-b", org_id="org-b").n_episodes == 1  # opting back in: seen again


def test_opt_out_comes_from_config_file_and_env(rtrl_home, monkeypatch):
    from rl_core.config import load_config

    monkeypatch.setenv("RTRL_HARVEST__OPT_OUT_ORGS", '["org-a", "org-c"]')
    cfg = load_config()
    land(Lake(cfg.lake_root), traffic(START + timedelta(hours=2)))
    harvest(cfg, START, END, 1, "run-env")
    assert harvested(cfg, "run-env") == [("org-b", "u1")]


def test_forget_is_honoured_by_later_harvests_even_for_rows_landing_after_it(cfg):
    lake = Lake(cfg.lake_root)
    land(lake, traffic(START + timedelta(hours=1)))
    forget(lake, "org-a", "u1", reason="user request")
    forget(lake, "org-c")
    # events of forgotten subjects still in flight (the WAL not yet compacted) land after the request
    late = [interaction_row(START + timedelta(hours=3), org_id="org-a", user_id="u1", session_id="late"),
            interaction_row(START + timedelta(hours=3), org_id="org-c", user_id="u7", session_id="late-c"),
            interaction_row(START + timedelta(hours=3), org_id="org-a", user_id="u3", session_id="ok")]
    land(lake, late)
    r = harvest(cfg, START, END, 1, "run-after")
    assert harvested(cfg, "run-after") == [("org-a", "u2"), ("org-a", "u3"), ("org-b", "u1")]
    assert r.n_excluded == 2  # the two late rows; the others were already removed from the lake by forget
    fb = lake.read_window("feedback", START, END + timedelta(hours=6))
    eps = set(lake.read_parquet("runs/run-after/episodes.parquet")["event_id"].to_pylist())
    assert eps <= set(fb["event_id"].to_pylist())


def test_org_filter_harvests_one_org_only(cfg):
    land(Lake(cfg.lake_root), traffic(START + timedelta(hours=1)))
    r = harvest(cfg, START, END, 1, "run-org-a", org_id="org-a")
    assert harvested(cfg, "run-org-a") == [("org-a", "u1"), ("org-a", "u2")]
    assert (r.n_interactions, r.n_episodes, r.org_id) == (2, 2, "org-a")
    assert Lake(cfg.lake_root).read_json("runs/run-org-a/harvest.json")["org_id"] == "org-a"
    with pytest.raises(ValueError, match="org_id"):
        harvest(cfg, START, END, 1, "run-bad", org_id=" ")
    assert not Lake(cfg.lake_root).exists("runs/run-bad")


def test_compaction_drops_events_in_flight_of_forgotten_subjects(cfg, tmp_path):
    from rl_core.collect.compact import compact
    from rl_core.collect.wal import WriteAheadLog

    lake = Lake(cfg.lake_root)
    rows = traffic(START + timedelta(hours=1))  # org-a/u1, org-a/u2, org-b/u1, org-c/u9
    log = WriteAheadLog(tmp_path / "wal")
    for r in rows:  # acknowledged before the request, compacted after it
        log.append("interactions", r)
        log.append("feedback", feedback_row(r, "thumbs", value_bool=True))
    log.close()
    forget(lake, "org-a", "u1")
    forget(lake, "org-c")
    res = compact(tmp_path / "wal", lake)
    assert res.forgotten == 4 and res.rows_written == {"interactions": 2, "feedback": 2}
    left = lake.read_window("interactions", START, END)
    assert sorted(zip(left["org_id"].to_pylist(), left["user_id"].to_pylist(), strict=True)) == [
        ("org-a", "u2"), ("org-b", "u1")]
    assert set(lake.read_window("feedback", START, END + timedelta(hours=1))["event_id"].to_pylist()) == set(
        left["event_id"].to_pylist())
