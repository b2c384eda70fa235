"""A harvest mapped over parts of its window (`[harvest] map_hours`, the DAG's harvest.part tasks) gives the same
episodes, row for row, and the same counts as one harvest of the window; parts that do not tile it are refused."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from lab.testing.synth import generate, window
from rl_core.config import HarvestConfig
from rl_core.harvest import HarvestResult, harvest, merge_parts, plan_parts
from rl_core.lake import Lake

START, END = window()  # 5 h, on hour boundaries
COUNTS = ("n_interactions", "n_episodes", "n_stale", "n_with_feedback", "n_excluded", "n_consumed")


def utc(h: int, m: int = 0) -> datetime:
    return datetime(2026, 12, 2, h, m, tzinfo=timezone.utc)


def test_plan_cuts_at_hour_boundaries_and_tiles_the_window():
    assert plan_parts(START, END, 0) == [(START, END)]
    hourly = plan_parts(START, END, 1)
    assert len(hourly) == 5 and hourly[0][0] == START and hourly[-1][1] == END
    assert all(a[1] == b[0] and a[1].minute == 0 for a, b in zip(hourly, hourly[1:], strict=False))
    assert plan_parts(utc(5, 30), utc(9, 40), 2) == [(utc(5, 30), utc(7)), (utc(7), utc(9)), (utc(9), utc(9, 40))]
    assert plan_parts(START, END, 24) == [(START, END)]  # one part longer than the window
    with pytest.raises(ValueError, match="map_hours must be an integer >= 0"):
        plan_parts(START, END, -1)
    with pytest.raises(ValueError, match="map_hours = 2 needs harvest.granularity = 'turn'"):
        plan_parts(START, END, 2, "session")  # e.g. the DAG's map_hours param on a session-granularity config


def harvest_in_parts(cfg, start, end, run_id: str, hours: int) -> HarvestResult:
    parts = [harvest(cfg, start, end, 2, run_id, part=p) for p in plan_parts(start, end, hours)]
    return merge_parts(cfg, start, end, run_id, list(reversed(parts)))  # mapped results come in any order


@pytest.mark.parametrize(("start", "end", "hours"), [(START, END, 1), (utc(5, 30), utc(9, 40), 2)])
def test_parts_merge_into_the_one_task_harvest(cfg, start, end, hours):
    lake = Lake(cfg.lake_root)
    generate(4000, START - timedelta(hours=1), END + timedelta(hours=1), seed=3, lake=lake)
    cfg.harvest.opt_out_orgs = ["org-initech"]  # data rights apply in every part
    whole = harvest(cfg, start, end, 2, "whole")
    parted = harvest_in_parts(cfg, start, end, "parted", hours)
    assert whole.n_episodes > 1000 and whole.n_excluded > 100 and whole.n_with_feedback > 100
    assert [getattr(parted, k) for k in COUNTS] == [getattr(whole, k) for k in COUNTS]
    a, b = lake.read_parquet(lake.run("whole").episodes), lake.read_parquet(lake.run("parted").episodes)
    assert a.equals(b)  # same rows, same order, same values
    manifest = lake.read_json(lake.run("parted").manifest)
    assert manifest["parts"] == len(plan_parts(start, end, hours)) and manifest["n_episodes"] == whole.n_episodes
    assert manifest["start"] == start.isoformat() and manifest["end"] == end.isoformat()


def test_merge_refuses_parts_that_do_not_tile_the_window(cfg):
    generate(500, START, END, seed=4, lake=Lake(cfg.lake_root))
    parts = [harvest(cfg, START, END, 2, "gap", part=p) for p in plan_parts(START, END, 1)]
    with pytest.raises(ValueError, match="do not tile the window"):
        merge_parts(cfg, START, END, "gap", parts[:2] + parts[3:])  # an hour lost
    with pytest.raises(ValueError, match="do not tile the window"):
        merge_parts(cfg, START, END + timedelta(hours=1), "gap", parts)  # the window's last hour missing
    other = harvest(cfg, START, END, 2, "other", part=plan_parts(START, END, 1)[2])
    with pytest.raises(ValueError, match="cannot merge"):
        merge_parts(cfg, START, END, "gap", parts[:2] + [other] + parts[3:])
    assert not Lake(cfg.lake_root).exists(Lake.run("gap").episodes)  # nothing written by a refused merge
    with pytest.raises(ValueError, match="not inside the window"):
        harvest(cfg, START, END, 2, "gap", part=(START - timedelta(hours=1), START + timedelta(hours=1)))


def test_parts_need_turn_granularity():
    with pytest.raises(ValueError, match="harvest.map_hours = 1 needs harvest.granularity = 'turn'"):
        HarvestConfig(map_hours=1, granularity="session")
    assert HarvestConfig(map_hours=1).map_hours == 1
