"""What an operator sees (issue 22), through real `dag.test()` runs and the real gate operator.

- Overlapping windows train each episode once: a manual run (a `make cycle`-style window around the traffic)
  trains and registers; the scheduled run of the same traffic then skips, naming the run that consumed it.
- A window without traffic ends skipped with its reason, not failed at gate_raw with "observed 0".
- A gate's refusal is the first line of its log; Great Expectations' registry noise is gone.
- The two run ids meet: the window task's return value and first log line carry both, and the MLflow version
  and training run carry the Airflow run id.
And issue 41: a run's data interval is its window (a manual window is named as the data interval; params that
disagree with it are refused at `window`, with why, and the run emits no asset); the outcome task's state is the
outcome's (skipped for a skipped window); `rtrl experiment`'s in-process DAG run gets its exact window.
Airflow metadata in the session's temp AIRFLOW_HOME (tests/conftest.py); nothing is mocked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WINDOW_END = datetime(2026, 12, 2, 10, tzinfo=UTC)  # logical date -> data interval [05:00, 10:00) on the grid
RUN_ID = "cycle-20261202T1000"
MANUAL = {"start": "2026-12-02T04:30:00+00:00", "end": "2026-12-02T10:30:00+00:00"}  # around the traffic
MANUAL_RUN = "cycle-20261202T0430-20261202T1030"
MANUAL_WINDOW = tuple(datetime.fromisoformat(v) for v in MANUAL.values())
AFTER_HARVEST = ["harvest.gate_raw", "harvest.exclude", "harvest.gate_episodes", "rewards.score", "rewards.gate_rewards",
                 "train.train", "evaluate.evaluate", "promote.register",
                 "promote.gate_promotion", "promote.deploy"]


@pytest.fixture
def af(registered, monkeypatch):
    """A registered tiny champion (version 1), a migrated Airflow DB with the training pool, quick retries."""
    airflow = str(Path(sys.executable).parent / "airflow")
    env = dict(os.environ)
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    subprocess.run([airflow, "pools", "set", "rtrl_training", "1", "rtrl tests"], env=env, check=True,
                   capture_output=True, timeout=120)
    monkeypatch.setenv("RTRL_AIRFLOW__RETRY_DELAY_S", "1")
    return registered


def traffic(cfg, n: int = 24) -> None:
    from lab.testing.synth import ArmSpec, generate
    from rl_core.lake import Lake

    generate(n, WINDOW_END - timedelta(hours=5), WINDOW_END, seed=7, lake=Lake(cfg.lake_root),
             arms=(ArmSpec(name="champion", model_version=1, share=1.0),), orgs=tuple(cfg.simulate.orgs),
             grace_hours=cfg.harvest.grace_hours)


def xcom(run_id: str, task_id: str, key: str = "return_value"):
    """A task's XCom in run run_id (as the UI's XCom tab shows it), None when there is none."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.query(XComModel).filter(XComModel.dag_id == "realtime_rl", XComModel.run_id == run_id,
                                              XComModel.task_id == task_id, XComModel.key == key).one_or_none()
        return None if row is None else XComModel.deserialize_value(row)


def note_of(run_id: str) -> str | None:
    """The run's note, as the run page and the grid's tooltip show it (set by the plugin's outcome listener)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        return session.query(DagRun).filter(DagRun.dag_id == "realtime_rl", DagRun.run_id == run_id).one().note


def interval_of(run_id: str) -> tuple[datetime, datetime]:
    """The run's data interval, as the UI shows it (the run page's Data Interval)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        dr = session.query(DagRun).filter(DagRun.dag_id == "realtime_rl", DagRun.run_id == run_id).one()
        return dr.data_interval_start, dr.data_interval_end


def run_at(logical_date: datetime, conf: dict | None = None,
           window: tuple[datetime, datetime] | None = None) -> tuple[str, dict[str, str], str, dict]:
    """One dag.test() run; returns its state, every task's state, the Airflow run id, and the window task's
    return value (as the UI shows it). window: the run's data interval, named as `rtrl cycle` names it
    (lab.dagrun.dag_test); else the grid window that ended at or before logical_date."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["realtime_rl"]
    dag.timetable.manual_window = window
    dr = dag.test(logical_date=logical_date, run_conf=conf or {})
    with create_session() as session:
        tis = session.query(TaskInstance).filter(TaskInstance.dag_id == dag.dag_id,
                                                 TaskInstance.run_id == dr.run_id).all()
        states = {ti.task_id: str(ti.state) for ti in tis}
    return str(dr.state), states, dr.run_id, xcom(dr.run_id, "window")


@pytest.mark.slow  # two DAG runs, one of them a whole cycle with training: ~2-3 min on the loaded 2-core box
def test_overlapping_windows_train_each_episode_once_and_the_ids_meet(af):
    from rl_core.registry import store
    from rl_core.registry.register import find_version

    cfg = af
    traffic(cfg)
    # the manual window, named as its data interval (as `rtrl cycle` and the form's "Specify Manually" do)
    state, tasks, manual_af_run, manual_window = run_at(WINDOW_END + timedelta(hours=5), window=MANUAL_WINDOW)
    assert state == "success" and set(tasks.values()) == {"success"}, tasks
    assert interval_of(manual_af_run) == MANUAL_WINDOW  # what the UI shows is what was harvested
    v2 = find_version(cfg, MANUAL_RUN)
    assert v2 == 2 and store.aliases(cfg) == {"champion": 1, "challenger": 2}

    # the scheduled run of the same traffic: every episode is consumed, so it skips, trains nothing
    state, tasks, _, window = run_at(WINDOW_END)
    assert window["run_id"] == RUN_ID
    assert state == "success", tasks
    assert tasks["harvest.harvest"] == "skipped", tasks
    for tid in AFTER_HARVEST:
        assert tasks[tid] == "skipped", (tid, tasks[tid])
    assert find_version(cfg, RUN_ID) is None and store.known_versions(cfg) == [1, 2]
    assert store.aliases(cfg) == {"champion": 1, "challenger": 2}
    assert not (cfg.models_dir / "runs" / RUN_ID).exists()  # the trainer never started
    from rl_core.harvest import read_manifest
    from rl_core.lake import Lake

    manifest = read_manifest(Lake(cfg.lake_root), RUN_ID)
    assert manifest["n_consumed"] == 24 and manifest["consumed_by"][0]["run_id"] == MANUAL_RUN

    # the ids meet: the window task's return value, the version and the trainer's MLflow run
    assert manual_window["run_id"] == MANUAL_RUN and manual_window["airflow_run_id"] == manual_af_run
    mv = store.get_version(cfg, v2)
    assert mv.tags["run_id"] == MANUAL_RUN and mv.tags["airflow.run_id"] == manual_af_run
    training = store.client(cfg).get_run(mv.run_id)
    assert training.info.run_name == f"v{v2}-{MANUAL_RUN}" and training.data.tags["airflow.run_id"] == manual_af_run
    # the checkpoint's card, where the MLflow UI shows it: metrics by prefix, reports as artifacts, the table
    assert {"reward/mean", "train/kl_mean", "train/kl", "eval/pass_rate", "eval/parent_pass_rate"} <= set(
        training.data.metrics), sorted(training.data.metrics)
    # one prefix per source (docs/production.md's table), and `_decide/*` copies of the deciding ones (rl_core/registry)
    assert {k.split("/")[0] for k in training.data.metrics} <= {"train", "reward", "eval", "monitor", "ab", "_decide"}
    arts = {a.path for a in store.client(cfg).list_artifacts(mv.run_id)}
    assert {"checkpoint", "eval", "verdicts", "charts"} <= arts, arts
    assert "| parent | v1 |" in mv.description and "| run | " + MANUAL_RUN in mv.description


@pytest.mark.slow  # ~40 s: the DAG up to harvest
def test_a_window_without_traffic_ends_skipped_not_failed(af):
    from rl_core.harvest import read_manifest
    from rl_core.lake import Lake
    from rl_core.registry import store

    cfg = af
    state, tasks, af_run, _ = run_at(WINDOW_END)
    assert state == "success", tasks  # the grid shows the run green with its tasks skipped, not red
    assert tasks["window"] == "success" and tasks["ab.ab_verdict"] == "success"
    assert tasks["harvest.harvest"] == "skipped", tasks
    for tid in AFTER_HARVEST:
        assert tasks[tid] == "skipped", (tid, tasks[tid])
    assert read_manifest(Lake(cfg.lake_root), RUN_ID)["n_interactions"] == 0
    assert store.known_versions(cfg) == [1] and store.aliases(cfg) == {"champion": 1}
    # the outcome says why in one line (the task's return value), its state says skipped in the grid's last
    # column (the run stays green), and MLflow hears of the skipped window too
    assert tasks["outcome"] == "skipped", tasks
    line = xcom(af_run, "outcome")
    assert line.startswith("skipped: no traffic in [2026-12-02T05:00:00+00:00, 2026-12-02T10:00:00+00:00)"), line
    assert note_of(af_run) == line  # the run's note: what the run page shows first
    c = store.client(cfg)
    runs = c.search_runs([c.get_experiment_by_name(cfg.mlflow.experiment + "-cycles").experiment_id])
    assert [(r.info.run_name, r.data.tags["outcome"]) for r in runs] == [(RUN_ID, "skipped")]


def asset_events(run_id: str) -> list[str]:
    """The assets run run_id emitted events for, by name."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(AssetModel.name).join(AssetEvent, AssetEvent.asset_id == AssetModel.id).filter(
            AssetEvent.source_dag_id == "realtime_rl", AssetEvent.source_run_id == run_id).all()
        return sorted(name for (name,) in rows)


@pytest.mark.slow  # ~40 s: `window` refuses, every later task ends upstream_failed, then `outcome`
def test_params_that_disagree_with_the_data_interval_are_refused_and_the_run_emits_nothing(af):
    """The operator's stumble: the form's default logical date gives the run the grid window before it, while
    its start/end params named another; the UI showed the one and the run harvested the other. Now `window`
    refuses such a run, says why and how to trigger it, and nothing runs (no asset, no trainer)."""
    cfg = af
    traffic(cfg)  # a window with traffic: the refusal, not an empty window, is what stops the run
    state, tasks, af_run, window = run_at(WINDOW_END, MANUAL)
    assert interval_of(af_run) == (WINDOW_END - timedelta(hours=5), WINDOW_END)
    assert state == "failed" and tasks["window"] == "failed" and window is None, tasks
    assert tasks["ab.rollback"] == "success", tasks  # all_done: it runs, and has nothing to do
    assert {s for t, s in tasks.items() if t not in ("window", "ab.rollback", "outcome")} == {"upstream_failed"}, tasks
    refused = xcom(af_run, "window", "refused")
    assert refused.startswith("params start/end name the window [2026-12-02T04:30:00+00:00"), refused
    assert "Specify Manually" in refused
    assert tasks["outcome"] == "failed" and xcom(af_run, "outcome") == f"refused by window: {refused}"
    assert note_of(af_run) == f"refused by window: {refused}"
    assert asset_events(af_run) == [] and not (cfg.models_dir / "runs").exists()


@pytest.mark.slow  # ~1 min: a child process imports Airflow and runs the DAG up to `harvest`
def test_an_in_process_cycle_run_gets_exactly_its_window_as_data_interval(af, tmp_path):
    """`rtrl experiment`'s cycles run the DAG in one process (lab.dagrun.dags_test -> `python -m
    lab.dagrun`): `airflow dags test` could only infer a grid window, so the data interval was the last grid
    slot while the params named the traffic's minutes. Now the run's data interval is the window itself."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    from lab.cycle import airflow_env
    from lab.dagrun import dags_test
    from rl_core.window import Window

    cfg = af
    s, e = datetime(2026, 12, 3, 1, 7, tzinfo=UTC), datetime(2026, 12, 3, 1, 20, tzinfo=UTC)
    w = Window(s, e, "cycle-20261203T0107-20261203T0120")
    env = airflow_env(cfg) | {k: os.environ[k] for k in ("AIRFLOW_HOME", "AIRFLOW__CORE__UNIT_TEST_MODE")}
    log = tmp_path / "dags-test.log"
    assert dags_test(env, w, log, "realtime_rl", {}, None) == 0, log.read_text()[-3000:]
    with create_session() as session:
        runs = session.query(DagRun).filter(DagRun.dag_id == "realtime_rl", DagRun.data_interval_start == s).all()
        assert [(r.data_interval_end, str(r.run_type)) for r in runs] == [(e, "manual")]
        af_run = runs[0].run_id
    assert xcom(af_run, "window")["run_id"] == w.run_id
    assert xcom(af_run, "outcome").startswith("skipped: no traffic in [2026-12-03T01:07:00+00:00"), log.read_text()[-3000:]


def test_a_gate_refusal_is_the_first_line_of_its_log(registered, capsys):
    """gate_raw on planted defects, through the operator as the DAG runs it: the reasons come first."""
    from airflow.sdk.exceptions import AirflowFailException
    from rtrl_operators import DataQualityGateOperator

    from lab.testing.synth import ArmSpec, Defects, generate
    from rl_core.lake import Lake

    cfg = registered
    generate(24, WINDOW_END - timedelta(hours=5), WINDOW_END, seed=7, lake=Lake(cfg.lake_root),
             arms=(ArmSpec(name="champion", model_version=1, share=1.0),), orgs=tuple(cfg.simulate.orgs),
             defects=Defects(duplicate_events=4), grace_hours=cfg.harvest.grace_hours)
    capsys.readouterr()
    gate = DataQualityGateOperator(task_id="gate_raw", check="gate_raw", window={
        "run_id": RUN_ID, "start": (WINDOW_END - timedelta(hours=5)).isoformat(), "end": WINDOW_END.isoformat()})
    with pytest.raises(AirflowFailException, match="event_id unique"):
        gate.execute({})
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.strip()]
    assert "gate_raw refused the cycle: " in lines[0] and "event_id unique" in lines[0], lines[:3]
    assert any('"interactions": ' in line for line in lines[1:])  # the full report follows


def test_great_expectations_registry_noise_is_silenced():
    """Importing GX logs ~220 'Skipping registering function ... because it is a closure' lines at INFO; a task
    log runs at INFO. A fresh process (GX not yet imported) validating once must print none of them."""
    code = ("import logging, sys\n"
            "logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
            "import pandas as pd\n"
            "from rl_core.quality.gx import Check, validate\n"
            "checks = [Check('ExpectColumnValuesToNotBeNull', {'column': 'event_id'}, 'present')]\n"
            "print('success', validate(pd.DataFrame({'event_id': ['a', 'b']}), checks, 't').success)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert "success True" in out.stdout, out.stderr[-2000:]
    assert "because it is a closure" not in out.stdout + out.stderr
    assert "INFO:great_expectations" not in out.stdout + out.stderr  # nor GX's other INFO chatter
