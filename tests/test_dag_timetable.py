"""Windows on one grid (anchor 2026-01-01T00:00Z + k x 5 h) for scheduled runs, backfills and manual runs.

The DAG is serialized and read back as the scheduler and the API server see it (which also proves the plugin
registers the timetable), and its runs are asked for the way they ask: `next_dagrun_info` for the scheduler,
`iter_dagrun_infos_between` for a backfill. No scheduler runs here (tests/test_dag_scheduler.py has one).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
H = timedelta(hours=1)
DEC1 = datetime(2026, 12, 1, tzinfo=UTC)  # 8016 h after the anchor: grid points at 04, 09, 14, 19 h


@pytest.fixture(scope="module")
def scheduler_dag():
    """realtime_rl as the scheduler loads it: serialized by the DAG processor, deserialized by the scheduler."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["realtime_rl"]
    return DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))


def intervals(dag, start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
    """The data intervals a backfill from `start` to `end` creates (what Airflow's backfill code iterates)."""
    return [(i.data_interval.start, i.data_interval.end) for i in dag.iter_dagrun_infos_between(start, end)]


def test_the_docs_backfill_example_makes_one_run_on_the_grid(scheduler_dag):
    doc = (REPO / "docs" / "production.md").read_text()
    ts = r"(\d{4}-\d\d-\d\dT[\d:]+[+-]\d\d:\d\d)"
    m = re.search(rf"airflow backfill create --dag-id realtime_rl\s+--from-date {ts}\s+--to-date {ts}", doc)
    assert m, "docs/production.md lost its `airflow backfill create` example"
    start, end = (datetime.fromisoformat(v) for v in m.groups())
    assert intervals(scheduler_dag, start, end) == [(start, end)]


def test_backfill_ranges_become_the_grid_windows_inside_them(scheduler_dag):
    assert intervals(scheduler_dag, DEC1 + 4 * H, DEC1 + 14 * H) == [(DEC1 + 4 * H, DEC1 + 9 * H),
                                                                      (DEC1 + 9 * H, DEC1 + 14 * H)]
    # a misaligned range keeps only whole grid windows: never [05:00, 10:00), which would straddle two
    assert intervals(scheduler_dag, DEC1 + 5 * H, DEC1 + 15 * H) == [(DEC1 + 9 * H, DEC1 + 14 * H)]
    assert intervals(scheduler_dag, DEC1 + 5 * H, DEC1 + 13 * H) == []


def test_the_scheduled_run_is_the_latest_complete_grid_window(scheduler_dag):
    """catchup=False: the scheduler's first run (and every run after a pause) is the last complete window."""
    from airflow.timetables.base import TimeRestriction

    from rl_core.window import SCHEDULE_ANCHOR, grid_floor

    tt = scheduler_dag.timetable
    info = tt.next_dagrun_info(last_automated_data_interval=None,
                               restriction=TimeRestriction(SCHEDULE_ANCHOR, None, catchup=False))
    start, end = info.data_interval
    now = datetime.now(UTC)
    assert end == grid_floor(now, 5) and end - start == 5 * H  # Airflow's delta timetable: one hour off
    assert info.run_after == end
    nxt = tt.next_dagrun_info(last_automated_data_interval=info.data_interval,
                              restriction=TimeRestriction(SCHEDULE_ANCHOR, None, catchup=True))
    assert nxt.data_interval == (end, end + 5 * H)


def test_a_manual_run_with_a_logical_date_gets_the_grid_window_before_it(scheduler_dag):
    from airflow.sdk import timezone

    got = scheduler_dag.timetable.infer_manual_data_interval(run_after=timezone.coerce_datetime(DEC1 + 12.5 * H))
    assert (got.start, got.end) == (DEC1 + 4 * H, DEC1 + 9 * H)
    on_point = scheduler_dag.timetable.infer_manual_data_interval(run_after=timezone.coerce_datetime(DEC1 + 9 * H))
    assert (on_point.start, on_point.end) == (DEC1 + 4 * H, DEC1 + 9 * H)


def test_the_cycle_runs_on_the_grid_the_plugin_registers_and_the_org_dag_on_its_episodes():
    """realtime_rl_orgs no longer shares the grid: it runs on the rtrl_episodes Asset realtime_rl emits, the window
    in the event (tests/test_orgs_asset.py), and serializes as the scheduler loads it."""
    from airflow import plugins_manager
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization
    from rtrl_operators.grid_timetable import GridTimetable

    assert plugins_manager.get_timetables_plugins()["rtrl_operators.grid_timetable.GridTimetable"] is GridTimetable
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    assert bag.dags["realtime_rl"].timetable == GridTimetable(5)
    orgs = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(bag.dags["realtime_rl_orgs"]))
    assert type(orgs.timetable).__name__ == "AssetTriggeredTimetable", orgs.timetable
    assert [key.name for key, _ in orgs.timetable.asset_condition.iter_assets()] == ["rtrl_episodes"]
