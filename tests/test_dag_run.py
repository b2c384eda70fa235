"""The realtime_rl DAG run for real with `dag.test()`: tiny model, lake and MLflow in a temp RTRL_HOME,
Airflow metadata in the session's temp AIRFLOW_HOME (tests/conftest.py). Nothing is mocked: every task
calls the real stage (DuckDB harvest, GX gates, rewards, DeepSpeed-launcher trainer, eval, MLflow)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WINDOW_END = datetime(2026, 12, 2, 10, tzinfo=UTC)  # logical date -> data interval [05:00, 10:00)
RUN_ID = "cycle-20261202T1000"
DOWNSTREAM_OF_GATE_RAW = ["harvest.exclude", "harvest.gate_episodes", "rewards.score", "rewards.gate_rewards", "train.train", "evaluate.evaluate", "promote.register", "promote.gate_promotion",
                          "promote.deploy"]


@pytest.fixture(scope="session")
def airflow_db():
    """`airflow db migrate` once per session (SQLite in the session AIRFLOW_HOME) and the training pool."""
    airflow = str(Path(sys.executable).parent / "airflow")
    env = dict(os.environ)
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    subprocess.run([airflow, "pools", "set", "rtrl_training", "1", "rtrl tests"], env=env, check=True,
                   capture_output=True, timeout=120)
    return Path(env["AIRFLOW_HOME"])


@pytest.fixture
def af_env(registered, airflow_db, monkeypatch):
    """A registered tiny champion (version 1) and quick retries, so a broken stage fails in seconds."""
    monkeypatch.setenv("RTRL_AIRFLOW__RETRY_DELAY_S", "1")
    return registered


def write_window(cfg, n: int = 24, arms=None, **defects) -> None:
    """Raw interactions + feedback in the window (default: all served by version 1, the champion), through
    the real lake."""
    from datetime import timedelta

    from lab.testing.synth import ArmSpec, Defects, generate
    from rl_core.lake import Lake

    generate(n, WINDOW_END - timedelta(hours=5), WINDOW_END, seed=7, lake=Lake(cfg.lake_root),
             arms=arms or (ArmSpec(name="champion", model_version=1, share=1.0),), defects=Defects(**defects),
             orgs=tuple(cfg.simulate.orgs), grace_hours=cfg.harvest.grace_hours)


LAST_RUN: dict[str, str] = {}  # the Airflow run id of the latest run_dag()


def run_dag(conf: dict | None = None) -> tuple[str, dict[str, str]]:
    """One dag.test() run at WINDOW_END; returns the run state and every task's final state."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.session import create_session

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["realtime_rl"]
    dr = dag.test(logical_date=WINDOW_END, run_conf=conf or {})
    LAST_RUN["run_id"] = dr.run_id
    with create_session() as session:
        from airflow.models.taskinstance import TaskInstance

        tis = session.query(TaskInstance).filter(TaskInstance.dag_id == dag.dag_id,
                                                 TaskInstance.run_id == dr.run_id).all()
        return str(dr.state), {ti.task_id: str(ti.state) for ti in tis}


def outcome_line() -> str:
    """The latest run's `outcome` task return value: its one-line outcome, as the UI's XCom tab shows it."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        xcom = session.query(XComModel).filter(XComModel.dag_id == "realtime_rl", XComModel.run_id == LAST_RUN["run_id"],
                                               XComModel.task_id == "outcome", XComModel.key == "return_value").one()
        return XComModel.deserialize_value(xcom)


def asset_events() -> list[str]:
    """The assets the latest run emitted events for, by name."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(AssetModel.name).join(AssetEvent, AssetEvent.asset_id == AssetModel.id).filter(
            AssetEvent.source_dag_id == "realtime_rl", AssetEvent.source_run_id == LAST_RUN["run_id"]).all()
        return sorted(name for (name,) in rows)


def cycle_run(cfg):
    """The window's MLflow run in the cycles' experiment (one per window, whatever its outcome)."""
    from rl_core.registry import store

    c = store.client(cfg)
    exp = c.get_experiment_by_name(cfg.mlflow.experiment + "-cycles")
    runs = c.search_runs([exp.experiment_id], filter_string=f"tags.run_id = '{RUN_ID}'")
    assert len(runs) == 1, runs
    return runs[0]


def outputs(cfg) -> dict[str, str]:
    """Content hashes of the run's data outputs (tables compared by content, not file bytes)."""
    from rl_core.lake import Lake

    lake = Lake(cfg.lake_root)
    out = {}
    for name in ("episodes", "rewards"):
        t = lake.read_parquet(f"runs/{RUN_ID}/{name}.parquet").sort_by("event_id")
        out[name] = hashlib.sha256(str(t.to_pylist()).encode()).hexdigest()
    return out


@pytest.mark.slow  # ~100 s on the loaded 2-core box: Airflow's in-process execution API alone takes ~20 s
def test_failing_gate_stops_the_cycle_and_moves_nothing(af_env):
    """Planted defects (positive logprobs, duplicated events) -> gate_raw fails -> nothing downstream runs."""
    from rl_core.lake import Lake
    from rl_core.registry import store
    from rl_core.reports import read_verdict

    cfg = af_env
    write_window(cfg, positive_logprobs=5, duplicate_events=4)
    state, tasks = run_dag()
    assert state == "failed"
    assert tasks["harvest.gate_raw"] == "failed"
    for tid in DOWNSTREAM_OF_GATE_RAW:
        assert tasks[tid] == "upstream_failed", (tid, tasks[tid])
    verdict = read_verdict(Lake(cfg.lake_root), RUN_ID, "gate_raw")
    assert verdict is not None and not verdict.passed and verdict.reasons
    assert store.aliases(cfg) == {"champion": 1}  # no alias moved
    assert store.version_for_alias(cfg, "challenger") is None
    assert not (cfg.models_dir / "runs" / RUN_ID).exists()  # the trainer never started
    # the outcome: one line naming the gate and its first reason, in Airflow (the task fails: the run stays red)
    # and on the window's MLflow run; the harvest task succeeded, yet no stage's asset is emitted
    assert tasks["outcome"] == "failed"
    line = outcome_line()
    assert line.startswith(f"refused by gate_raw: {verdict.reasons[0]}"), line
    run = cycle_run(cfg)
    assert run.info.run_name == RUN_ID and run.info.status == "FAILED"
    assert run.data.tags["outcome"] == "refused" and run.data.tags["reason"].startswith("gate_raw: ")
    assert run.data.tags["airflow.run_id"] == LAST_RUN["run_id"] and run.data.tags["window"].startswith("[2026-12-02T05:00")
    assert tasks["harvest.harvest"] == "success" and asset_events() == []


@pytest.mark.slow
def test_a_hacking_live_challenger_trips_the_monitors_is_rolled_back_and_nothing_trains(af_env):
    """Champion v1 and a live challenger v2 that emits broken tool calls share the window. The cycle's own
    harvest keeps only the champion's lag range, so the monitors must score every served turn to see v2."""
    from lab.testing.synth import ArmSpec
    from rl_core.lake import Lake
    from rl_core.registry import promote, store

    cfg = af_env
    v2 = store.register_checkpoint(cfg, store.checkpoint_path(cfg, 1), run_name="hacky", tags={"parent_version": 1})
    store.set_alias(cfg, "challenger", v2, "test: deployed")
    write_window(cfg, n=160, arms=(ArmSpec(share=0.5),
                                   ArmSpec(name="challenger", model_version=v2, share=0.5, tool_p=0.5, broken_tool_p=0.6)))
    state, tasks = run_dag()
    assert state == "failed"
    assert tasks["ab.monitors"] == "failed" and tasks["ab.rollback"] == "success", tasks
    for tid in ("ab.ab_verdict", "harvest.harvest", "train.train", "evaluate.evaluate", "promote.register", "promote.gate_promotion", "promote.deploy"):
        assert tasks[tid] == "upstream_failed", (tid, tasks[tid])
    report = Lake(cfg.lake_root).read_json(f"runs/{RUN_ID}/monitors.json")
    assert report["tripped"] == [v2] and report["parent_version"] == 1
    assert store.aliases(cfg) == {"champion": 1}  # the challenger is off traffic, the champion untouched
    assert v2 in promote.rolled_back_versions(cfg)
    assert not (cfg.models_dir / "runs" / RUN_ID).exists()  # the trainer never started
    assert tasks["outcome"] == "failed" and outcome_line().startswith("refused by monitors: "), outcome_line()
    assert asset_events() == []  # a window refused before its harvest emits no stage's asset


@pytest.mark.slow
def test_a_challenger_winning_the_ab_by_gaming_the_reward_is_rolled_back_not_promoted(af_env):
    """v2 persists more edits (the A/B primary metric: the A/B alone promotes it) and asks clarifying questions
    three times as often (a hack the monitors catch). The monitors judge first, so v2 leaves traffic and no A/B
    verdict is applied. With the A/B first, v2 became champion and the monitors then judged nothing newer."""
    from datetime import timedelta

    from lab.testing.synth import ArmSpec
    from rl_core.ab.verdict import ab_verdict
    from rl_core.registry import promote, store

    cfg = af_env
    v2 = store.register_checkpoint(cfg, store.checkpoint_path(cfg, 1), run_name="gamer", tags={"parent_version": 1})
    store.set_alias(cfg, "challenger", v2, "test: deployed")
    write_window(cfg, n=1600, arms=(ArmSpec(share=0.5), ArmSpec(name="challenger", model_version=v2, share=0.5,
                                                                 edit_applied_p=0.8, edit_persisted_p=0.9, dissatisfied_p=0.02,
                                                                 clarify_p=0.2)))
    ab = ab_verdict(cfg, WINDOW_END - timedelta(hours=5), WINDOW_END, log=False)
    assert (ab.challenger_version, ab.decision) == (v2, "promote"), ab.reasons  # what the A/B alone would do
    state, tasks = run_dag()
    assert state == "failed"
    assert tasks["ab.monitors"] == "failed" and tasks["ab.rollback"] == "success", tasks
    assert tasks["ab.ab_verdict"] == "upstream_failed" and tasks["harvest.harvest"] == "upstream_failed", tasks
    assert store.aliases(cfg) == {"champion": 1}  # never promoted; off traffic
    assert v2 in promote.rolled_back_versions(cfg)
    mv = store.get_version(cfg, v2)
    assert mv.tags["monitor.verdict"] == "tripped" and "clarify_rate" in mv.tags["rolled_back_reason"]


@pytest.mark.slow
def test_full_cycle_makes_a_challenger_and_a_rerun_is_identical(af_env, monkeypatch):
    """...and the rerun harvests the window in five mapped tasks of an hour (`[harvest] map_hours`): the same
    episodes and rewards as the first run's one task, merged into one file."""
    from rl_core.registry import store
    from rl_core.registry.register import find_version

    cfg = af_env
    write_window(cfg)
    state, tasks = run_dag()
    assert state == "success", tasks
    assert set(tasks.values()) == {"success"}, tasks
    version = find_version(cfg, RUN_ID)
    assert version == 2
    assert outcome_line().startswith("registered v2 -> challenger"), outcome_line()
    assert cycle_run(cfg).data.tags["outcome"] == "registered"
    assert asset_events() == ["rtrl_checkpoint", "rtrl_episodes", "rtrl_eval", "rtrl_registry", "rtrl_rewards"]
    assert store.aliases(cfg) == {"champion": 1, "challenger": 2}
    tags = store.get_version(cfg, version).tags
    assert tags["run_id"] == RUN_ID and tags["parent_version"] == "1"
    from rl_core.lake import Lake

    assert Lake(cfg.lake_root).read_json(f"runs/{RUN_ID}/monitors.json")["parent_version"] == 1  # the champion
    first = outputs(cfg)

    assert Lake(cfg.lake_root).read_json(f"runs/{RUN_ID}/harvest.json")["parts"] == 1

    monkeypatch.setenv("RTRL_HARVEST__MAP_HOURS", "1")
    state2, tasks2 = run_dag()  # the same window again: same files, same version, nothing new
    assert state2 == "success", tasks2
    assert Lake(cfg.lake_root).read_json(f"runs/{RUN_ID}/harvest.json")["parts"] == 5
    assert outputs(cfg) == first
    assert find_version(cfg, RUN_ID) == 2
    assert store.aliases(cfg) == {"champion": 1, "challenger": 2}


@pytest.mark.slow
def test_dry_run_computes_but_registers_nothing(af_env):
    from rl_core.registry import store

    cfg = af_env
    write_window(cfg)
    state, tasks = run_dag({"dry_run": True})
    assert state == "success", tasks
    assert tasks["train.train"] == "success" and tasks["evaluate.evaluate"] == "success"
    assert tasks["promote.register"] == "skipped" and tasks["promote.deploy"] == "skipped"
    assert store.aliases(cfg) == {"champion": 1}
