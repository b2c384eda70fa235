"""Every run's data interval is its harvest window (issue 41): the rules the `window` task applies, the timetable
hook that gives `rtrl experiment`'s in-process runs their exact window, and what the trigger and backfill dialogs
say. No DAG runs here (tests/test_dag_operator_view.py and tests/test_dag_scheduler.py run them)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
H = timedelta(hours=1)
DEC2 = datetime(2026, 12, 2, tzinfo=UTC)
GRID = (DEC2 + 5 * H, DEC2 + 10 * H)  # a grid window, e.g. a scheduled run's data interval
MINUTES = {"start": "2026-12-02T04:30:00+00:00", "end": "2026-12-02T10:30:00+00:00"}  # a `make cycle`-style window


def resolve(params: dict, interval, run_type: str | None = "manual"):
    from rl_core.window import resolve_window

    start, end = interval if interval else (None, None)
    return resolve_window(params, start, end, 5, now=DEC2 + 23 * H, run_type=run_type)


@pytest.mark.parametrize("run_type", ["scheduled", "backfill", "manual"])
def test_the_data_interval_is_the_window_of_every_run_that_has_one(run_type):
    w = resolve({"dry_run": True, "map_hours": 1}, GRID, run_type)
    assert (w.start, w.end, w.run_id) == (*GRID, "cycle-20261202T1000")


def test_a_manual_window_is_named_by_its_data_interval():
    """`rtrl cycle` and the trigger form's "Specify Manually" give the window as the data interval; start/end
    that say the same are accepted (the REST call of an older client)."""
    s, e = (datetime.fromisoformat(v) for v in MINUTES.values())
    assert resolve({}, (s, e)).run_id == "cycle-20261202T0430-20261202T1030"
    assert resolve(MINUTES, (s, e)).run_id == "cycle-20261202T0430-20261202T1030"


def test_params_that_disagree_with_the_data_interval_are_refused_with_the_way_out():
    """The operator's stumble: a trigger with start/end and the form's default logical date ran on the grid slot
    before it while its params named another window; the UI showed the one, the run harvested the other."""
    from rl_core.window import WindowError

    with pytest.raises(WindowError) as refused:
        resolve(MINUTES, GRID)
    msg = str(refused.value)
    assert "[2026-12-02T04:30:00+00:00, 2026-12-02T10:30:00+00:00)" in msg  # what the params said
    assert "data interval, which Airflow shows as its window, is [2026-12-02T05:00:00+00:00" in msg  # what it shows
    assert "Specify Manually" in msg and "data_interval_start" in msg and "clear the Logical Date" in msg


def test_a_run_without_a_data_interval_takes_the_params_or_the_last_grid_window():
    """A trigger without a logical date (REST `logical_date: null`, the form's Logical Date cleared) has no data
    interval: start/end name its window, else the grid window that ended last."""
    assert resolve(MINUTES, None).run_id == "cycle-20261202T0430-20261202T1030"
    w = resolve({}, None)
    assert (w.start, w.end) == (DEC2 + 15 * H, DEC2 + 20 * H)  # now 23:00; grid points 00, 05, 10, 15, 20 h


def test_without_a_run_type_the_params_still_win():
    """realtime_rl_orgs passes no run type: its params-first rule (its tests name windows by params) stays."""
    assert resolve(MINUTES, GRID, run_type=None).run_id == "cycle-20261202T0430-20261202T1030"


@pytest.mark.parametrize("params, named", [
    ({"policy_version": 3}, "policy_version=3"),
    ({"start": GRID[0].isoformat(), "end": GRID[1].isoformat()}, "start=2026-12-02T05:00:00+00:00"),
    ({"policy_version": 2, "dry_run": True}, "policy_version=2"),
])
def test_a_backfill_refuses_the_single_run_params(params, named):
    from rl_core.window import WindowError

    with pytest.raises(WindowError, match="mean nothing for a backfill") as refused:
        resolve(params, GRID, "backfill")
    assert named in str(refused.value)
    resolve(params, GRID, "manual" if "start" not in params else "scheduled")  # the same params, a single run: fine


def test_the_timetable_gives_dag_test_its_exact_window_and_serializes_without_it():
    """`dag.test()` can only ask the timetable for its run's data interval: lab.dagrun.dag_test sets
    manual_window on its own DAG object. Grid inference is untouched without it, and no scheduler ever sees it."""
    import airflow  # noqa: F401  puts the plugins folder on sys.path
    from rtrl_operators.grid_timetable import GridTimetable

    s, e = (datetime.fromisoformat(v) for v in MINUTES.values())
    tt = GridTimetable(5)
    assert tuple(tt.infer_manual_data_interval(run_after=DEC2 + 12 * H)) == GRID
    tt.manual_window = (s, e)
    assert tuple(tt.infer_manual_data_interval(run_after=DEC2 + 12 * H)) == (s, e)
    back = GridTimetable.deserialize(tt.serialize())
    assert back == tt and back.manual_window is None
    assert tuple(back.infer_manual_data_interval(run_after=DEC2 + 12 * H)) == GRID


def test_the_dialogs_say_what_a_backfill_does_and_which_params_it_refuses():
    """The trigger and backfill dialogs show each param's help under it, the single-run params in their own
    section: the backfill's open window and the schedule's share with "Unpause on trigger" are stated there."""
    from airflow.dag_processing.dagbag import DagBag

    from rl_core.window import SINGLE_RUN_PARAMS

    params = DagBag(dag_folder=str(REPO / "dags")).dags["realtime_rl"].params
    sections = {k: params.get_param(k).schema.get("section") for k in params}
    assert {k for k, v in sections.items() if v} == set(SINGLE_RUN_PARAMS)
    assert all("backfill refuses" in sections[k] for k in SINGLE_RUN_PARAMS)
    for key in ("start", "end"):
        assert "Only for a run without a data interval" in params.get_param(key).schema["description_md"]
    help_md = params.get_param("dry_run").schema["description_md"]
    assert params.get_param("dry_run").description is None  # else the UI shows the plain one instead
    for said in ("that has ended", "left out", "Unpause on", "one run fewer", "refuses start, end and policy_version"):
        assert said in help_md, said
