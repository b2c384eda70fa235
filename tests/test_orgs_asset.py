"""realtime_rl_orgs runs on the cycle's `rtrl_episodes` Asset (issue 42), and no DAG file edits sys.path.

The org DAG once ran on the cycle's grid timetable beside it and derived the same window a second time, and
harvested it a second time too (rewriting the episodes the cycle's `exclude` had just filtered). Now a realtime_rl run
whose episodes passed gate_raw and gate_episodes emits `rtrl_episodes` with its window in the event's extra, a refused
or skipped run emits none, and the org run trains on the window of the event that triggered it. Real Airflow:
`dag.test()` in the session's temp AIRFLOW_HOME (tests/conftest.py), the tiny model, a real lake.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parent.parent
WINDOW_END = datetime(2026, 12, 2, 10, tzinfo=UTC)  # logical date -> data interval [05:00, 10:00) on the grid
WINDOW = (WINDOW_END - timedelta(hours=5), WINDOW_END)
RUN_ID = "cycle-20261202T1000"
# what the event needs is the cycle up to gate_episodes: the stages after it are marked success without running
AFTER_EPISODES = r"(rewards|train|evaluate|promote)\..*|outcome"


def _bag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}, bag.import_errors
    return bag


def test_no_dag_file_edits_sys_path():
    """Plugins come from Airflow's plugins folder (on sys.path wherever Airflow runs), not from a DAG's own edit."""
    offenders = [f.name for f in (REPO / "dags").rglob("*.py") if "sys.path" in f.read_text()]
    assert offenders == []


def test_the_dags_import_with_only_the_plugins_folder_configured(tmp_path):
    """A fresh process with AIRFLOW__CORE__PLUGINS_FOLDER and the checkout on PYTHONPATH (what lab/airflow.py,
    docker-compose.yaml and tests/conftest.py set), the plugins folder itself not on it: both DAGs import."""
    probe = textwrap.dedent("""
        import sys
        from airflow.dag_processing.dagbag import DagBag
        bag = DagBag(dag_folder=sys.argv[1])
        assert bag.import_errors == {}, bag.import_errors
        print(sorted(bag.dags))
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", probe, str(REPO / "dags")], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "['realtime_rl', 'realtime_rl_orgs']"


def test_the_org_dag_is_scheduled_on_the_asset_gate_episodes_emits():
    from airflow.sdk.definitions.timetables.assets import AssetTriggeredTimetable

    bag = _bag()
    orgs, cycle = bag.dags["realtime_rl_orgs"], bag.dags["realtime_rl"]
    gate = cycle.get_task("harvest.gate_episodes")
    assert isinstance(orgs.timetable, AssetTriggeredTimetable)
    assert [orgs.timetable.asset_condition] == gate.outlets  # the same name and uri: one Asset
    assert [a.name for a in gate.outlets] == ["rtrl_episodes"] and gate._post_execute_hook is not None
    assert "start" in orgs.params and "end" in orgs.params  # a manual run (a backfill of one window) still names one


def _event(source_run: str, minute: int, **extra):
    start, end = WINDOW
    x = {"run_id": RUN_ID, "start": start.isoformat(), "end": end.isoformat(), "policy_version": 1} | extra
    return SimpleNamespace(extra=x, source_dag_id="realtime_rl", source_run_id=source_run,
                           timestamp=WINDOW_END + timedelta(minutes=minute))


def test_the_newest_of_several_queued_events_wins_and_a_windowless_one_is_refused(capsys):
    """Events that queue while an org run is busy all land in the next run: it trains on the newest window and names
    the others; an event without a window (one made by hand in the UI) is refused with what to do instead."""
    window = _bag().dags["realtime_rl_orgs"].get_task("window").python_callable
    cycle_event, from_event, episodes = (window.__globals__[n] for n in ("cycle_event", "from_event", "EPISODES"))
    older, newer = _event("scheduled__a", 1, run_id="cycle-20261202T0500"), _event("scheduled__b", 2)
    assert cycle_event({"triggering_asset_events": {episodes: [newer, older]}}) is newer
    assert "left out: the window of realtime_rl run scheduled__a" in capsys.readouterr().out
    assert cycle_event({"triggering_asset_events": {}}) is None and cycle_event({}) is None
    run = from_event(newer)
    assert (run.run_id, run.window.start, run.window.end, run.policy_version) == (RUN_ID, *WINDOW, 1)
    with pytest.raises(ValueError, match="names no window.*start/end instead"):
        from_event(SimpleNamespace(extra={"note": "by hand"}, source_dag_id=None, source_run_id=None))


# --- real runs --------------------------------------------------------------------------------------------------

@pytest.fixture
def af(registered, monkeypatch):
    """A registered tiny champion, a migrated Airflow DB with the training pool and both DAGs in it, the org DAG
    unpaused (Airflow queues an asset-triggered run only for an unpaused DAG), quick retries."""
    airflow = str(Path(sys.executable).parent / "airflow")
    env = dict(os.environ)
    for cmd in (["db", "migrate"], ["pools", "set", "rtrl_training", "1", "rtrl tests"], ["dags", "reserialize"],
                ["dags", "unpause", "realtime_rl_orgs"]):
        subprocess.run([airflow, *cmd], env=env, check=True, capture_output=True, timeout=300)
    monkeypatch.setenv("RTRL_AIRFLOW__RETRY_DELAY_S", "1")
    _clear_org_queue()
    return registered


def _clear_org_queue() -> None:
    from airflow.models.asset import AssetDagRunQueue
    from airflow.utils.session import create_session

    with create_session() as session:
        session.query(AssetDagRunQueue).filter(AssetDagRunQueue.target_dag_id == "realtime_rl_orgs").delete()


def _queued_org_runs() -> int:
    """Asset events waiting to start a realtime_rl_orgs run (what the scheduler turns into one)."""
    from airflow.models.asset import AssetDagRunQueue
    from airflow.utils.session import create_session

    with create_session() as session:
        return session.query(AssetDagRunQueue).filter(AssetDagRunQueue.target_dag_id == "realtime_rl_orgs").count()


def _episodes_events(run_id: str) -> list[tuple[int, dict]]:
    """(id, extra) of the rtrl_episodes events realtime_rl run run_id emitted."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(AssetEvent.id, AssetEvent.extra).join(AssetModel, AssetEvent.asset_id == AssetModel.id) \
            .filter(AssetModel.name == "rtrl_episodes", AssetEvent.source_dag_id == "realtime_rl",
                    AssetEvent.source_run_id == run_id).all()
        return [(i, dict(x or {})) for i, x in rows]


def _run(dag_id: str, **kw) -> tuple[str, dict[str, str], str]:
    """One dag.test(); the run's state, each task's state (mapped: its last instance's), the Airflow run id."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    dag = _bag().dags[dag_id]
    dr = dag.test(**kw)
    with create_session() as session:
        tis = session.query(TaskInstance).filter(TaskInstance.dag_id == dag_id, TaskInstance.run_id == dr.run_id)
        return str(dr.state), {ti.task_id: str(ti.state) for ti in tis}, dr.run_id


def _traffic(cfg, **defects) -> None:
    from lab.testing.synth import ArmSpec, Defects, generate
    from rl_core.lake import Lake

    generate(24, *WINDOW, seed=7, lake=Lake(cfg.lake_root), arms=(ArmSpec(name="champion", model_version=1, share=1.0),),
             defects=Defects(**defects), orgs=tuple(cfg.simulate.orgs), grace_hours=cfg.harvest.grace_hours)


@pytest.mark.slow  # two cycle runs up to harvest / gate_raw: ~2-3 min on the loaded 2-core box
def test_a_skipped_or_refused_cycle_emits_no_episodes_event_and_queues_no_org_run(af):
    state, tasks, skipped = _run("realtime_rl", logical_date=WINDOW_END)  # no traffic: skipped at harvest
    assert tasks["harvest.harvest"] == "skipped" and tasks["harvest.gate_episodes"] == "skipped", tasks
    assert _episodes_events(skipped) == [] and _queued_org_runs() == 0
    _traffic(af, positive_logprobs=5, duplicate_events=4)  # gate_raw refuses the window
    state, tasks, refused = _run("realtime_rl", logical_date=WINDOW_END)
    assert state == "failed" and tasks["harvest.gate_raw"] == "failed", tasks
    assert tasks["harvest.gate_episodes"] == "upstream_failed", tasks
    assert _episodes_events(refused) == [] and _queued_org_runs() == 0


@pytest.mark.slow  # the cycle up to gate_episodes, then an org run: ~3 min on the loaded 2-core box
def test_a_passed_cycle_emits_its_window_and_the_org_run_it_triggers_trains_on_it(af, monkeypatch):
    import airflow.models.dagrun as dagrun_module
    from airflow.models.asset import AssetEvent
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from rl_core.lake import Lake

    cfg = af
    _traffic(cfg)
    state, tasks, cycle = _run("realtime_rl", logical_date=WINDOW_END, mark_success_pattern=AFTER_EPISODES)
    assert tasks["harvest.gate_episodes"] == "success", tasks
    [(event_id, extra)] = _episodes_events(cycle)
    assert (extra["run_id"], extra["start"], extra["end"]) == (RUN_ID, *(t.isoformat() for t in WINDOW))
    assert extra["policy_version"] == 1 and extra["dry_run"] is False and extra["airflow_run_id"] == cycle
    assert _queued_org_runs() == 1, "the scheduler would start a realtime_rl_orgs run on it"

    # The run the scheduler makes consumes the queued events; dag.test() makes a manual run, so it is given the
    # event the same way (DagRun.consumed_asset_events), which its tasks read as triggering_asset_events.
    def consuming(**kw):
        dr = real(**kw)
        dr.consumed_asset_events.extend(kw["session"].query(AssetEvent).filter(AssetEvent.id == event_id).all())
        kw["session"].commit()
        return dr

    real = dagrun_module.get_or_create_dagrun
    monkeypatch.setattr(dagrun_module, "get_or_create_dagrun", consuming)
    episodes = Lake(cfg.lake_root).run(RUN_ID).episodes
    before = os.stat(Path(cfg.lake_root) / episodes).st_mtime_ns
    state, tasks, org_run = _run("realtime_rl_orgs", logical_date=None, run_conf={"min_episodes": 10**9})
    assert state == "success" and tasks["org_targets"] == "success" and tasks["report"] == "success", tasks
    with create_session() as session:
        row = session.query(XComModel).filter(XComModel.dag_id == "realtime_rl_orgs", XComModel.run_id == org_run,
                                              XComModel.task_id == "window", XComModel.key == "return_value").one()
        w = XComModel.deserialize_value(row)
    assert (w["run_id"], w["start"], w["end"], w["policy_version"]) == (RUN_ID, *(t.isoformat() for t in WINDOW), 1)
    assert w["cycle_run"] == cycle and w["airflow_run_id"] == org_run
    # the cycle's gated episodes are read, not harvested again (which would undo the cycle's `exclude`)
    assert os.stat(Path(cfg.lake_root) / episodes).st_mtime_ns == before


@pytest.mark.slow  # one org run in process: ~1 min on the loaded 2-core box
def test_an_in_process_org_run_gets_its_window_as_params(af):
    """`rtrl experiment`'s org cycles run realtime_rl_orgs in one process (lab.dagrun.dag_test): no realtime_rl event
    triggers that run, and an Asset-scheduled DAG has no timetable to tell the window, so the window goes in as the
    start/end params, the DAG's manual path."""
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from lab.dagrun import dag_test
    from rl_core.window import Window

    s, e = datetime(2026, 12, 3, 1, 7, tzinfo=UTC), datetime(2026, 12, 3, 1, 20, tzinfo=UTC)
    assert dag_test("realtime_rl_orgs", Window(s, e, "cycle-20261203T0107-20261203T0120"), {"min_episodes": 10**9}) \
        == "success"
    with create_session() as session:
        run = session.query(DagRun).filter(DagRun.dag_id == "realtime_rl_orgs").order_by(DagRun.id.desc()).first()
        row = session.query(XComModel).filter(XComModel.dag_id == "realtime_rl_orgs", XComModel.run_id == run.run_id,
                                              XComModel.task_id == "window", XComModel.key == "return_value").one()
        w = XComModel.deserialize_value(row)
    assert (w["run_id"], w["start"], w["end"], w["cycle_run"]) == ("cycle-20261203T0107-20261203T0120", s.isoformat(),
                                                                   e.isoformat(), None)
