"""The per-org DAG (dags/org_adapters.py): dynamic task mapping over orgs; a failing org does not block the others.

Real `dag.test()` on the tiny model: org-a's traffic is sound, org-b's has completion logprobs that do not
match its tokens (the trainer refuses them, naming the field), so org-b's mapped instance fails while
org-a's trains, evaluates, registers and deploys, and the report runs anyway."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from lab.testing.synth import feedback_row, interaction_row, window
from rl_core.lake import Lake
from rl_core.schema import to_table

REPO = Path(__file__).resolve().parent.parent
START, END = window()


def test_dag_maps_adapt_org_over_orgs_and_reports_whatever_happens():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert not bag.import_errors, bag.import_errors
    dag = bag.dags["realtime_rl_orgs"]
    assert set(dag.task_ids) == {"window", "live_orgs", "org_ab", "org_targets", "adapt_org", "report"}
    assert type(dag.get_task("org_ab")).__name__.endswith("MappedOperator")
    assert dag.get_task("org_ab").downstream_task_ids == {"report"}, "a failed A/B stops no org's training"
    adapt = dag.get_task("adapt_org")
    assert type(adapt).__name__.endswith("MappedOperator") and adapt.pool == "rtrl_training"
    assert dag.get_task("report").trigger_rule == "all_done"
    assert "adapt_org" in dag.get_task("org_targets").downstream_task_ids


def test_an_org_dag_that_drifts_from_org_cycle_fails_its_import():
    """realtime_rl_orgs calls pipeline.check_dag with ORG_CYCLE when parsed, as realtime_rl does with CYCLE: a task
    missing, or one that no longer waits for the one before it in its chain, is refused."""
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG

    from rl_core import pipeline

    def dag_of(dag_id: str, chains):
        with DAG(dag_id, schedule=None) as d:
            ops = {n: EmptyOperator(task_id=n) for n in dict.fromkeys(n for chain in chains for n in chain)}
            for chain in chains:
                for a, b in zip(chain, chain[1:], strict=False):
                    ops[a] >> ops[b]
        return d

    pipeline.check_dag(dag_of("same", pipeline.ORG_CYCLE), pipeline.ORG_CYCLE, "ORG_CYCLE")
    with pytest.raises(ValueError, match="not pipeline.ORG_CYCLE"):
        pipeline.check_dag(dag_of("no_report", [c[:-1] for c in pipeline.ORG_CYCLE]), pipeline.ORG_CYCLE, "ORG_CYCLE")
    unwaited = [*pipeline.ORG_CYCLE[:2], ("window", "org_targets"), ("adapt_org", "report")]
    with pytest.raises(ValueError, match="adapt_org must run after org_targets"):
        pipeline.check_dag(dag_of("unwaited", unwaited), pipeline.ORG_CYCLE, "ORG_CYCLE")


@pytest.fixture
def af_db(registered):
    airflow = str(Path(sys.executable).parent / "airflow")
    env = dict(os.environ)
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    subprocess.run([airflow, "pools", "set", "rtrl_training", "1", "rtrl tests"], env=env, check=True,
                   capture_output=True, timeout=120)
    return registered


@pytest.mark.slow
def test_a_failing_org_does_not_block_the_others(af_db):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    from lab.cycle import run_id_for
    from rl_core.orgs.registry import live_adapter
    from rl_core.reports import read_verdicts

    cfg = af_db
    lake = Lake(cfg.lake_root)
    for org in ("org-a", "org-b"):
        for i in range(10):
            lps = [-0.5, -0.9, -0.3] if org == "org-a" else [-0.5]  # org-b: 1 logprob for 3 tokens
            r = interaction_row(START + timedelta(minutes=5 * i), org_id=org, user_id=f"{org}-u{i % 2}",
                                session_id=f"{org}-s{i}", prompt_token_ids=[5 + i, 6, 7], completion_logprobs=lps)
            lake.write_partition("interactions", r["ts_request"], to_table("interactions", [r]))
            lake.write_partition("feedback", r["ts_request"],
                                 to_table("feedback", [feedback_row(r, "thumbs", value_bool=i % 2 == 0)]))
    os.environ["RTRL_EVAL__TASK_LIMIT"] = "2"  # the tasks load the config afresh
    try:
        dag = DagBag(dag_folder=str(REPO / "dags")).dags["realtime_rl_orgs"]
        dr = dag.test(run_conf={"start": START.isoformat(), "end": END.isoformat(), "min_episodes": 8})
    finally:
        del os.environ["RTRL_EVAL__TASK_LIMIT"]
    with create_session() as session:
        tis = session.query(TaskInstance).filter(TaskInstance.dag_id == dag.dag_id, TaskInstance.run_id == dr.run_id).all()
        states = {(ti.task_id, ti.map_index): str(ti.state) for ti in tis}
    assert states[("org_targets", -1)] == "success" and states[("report", -1)] == "success", states
    mapped = sorted(s for (tid, _), s in states.items() if tid == "adapt_org")
    assert mapped == ["failed", "success"], states
    run_id = run_id_for(START, END, cfg.airflow.schedule_hours)
    assert lake.exists(f"runs/{run_id}.org-a/adapter.json") and not lake.exists(f"runs/{run_id}.org-b/adapter.json")
    ok = all(v.passed for v in read_verdicts(lake, f"{run_id}.org-a").values())
    assert (live_adapter(cfg, "org-a") is not None) == ok and live_adapter(cfg, "org-b") is None


@pytest.mark.slow
def test_each_run_judges_every_live_adapter_and_rolls_back_a_worse_one(af_db, tmp_path):
    """The scheduled per-org A/B: acme's live adapter made its users more dissatisfied than acme's users on the base
    alone (half of them each, `[orgs] ab_share`), so the run takes it off acme's traffic; globex, without an adapter,
    is not judged; the harvest and the report still run."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from test_orgs_ab import _adapter_folder, org_log, write

    from lab.testing.ab_synth import ArmSpec
    from rl_core.orgs.registry import LIVE_ALIAS, adapter_registry, live_adapter, register_adapter_folder
    from rl_core.registry import store

    cfg = af_db
    av = register_adapter_folder(cfg, "org-acme", _adapter_folder(tmp_path, "a1"),
                                 {"parent_version": 1, "run_id": "manual-a1"})
    store.set_alias(adapter_registry(cfg, "org-acme"), LIVE_ALIAS, av.version, reason="test")
    write(Lake(cfg.lake_root), "acme", *org_log("org-acme", av.adapter_version, ArmSpec(1, dissatisfied=0.10),
                                                ArmSpec(1, dissatisfied=0.25), 6_000, 600, seed=43, start=START,
                                                end=END))
    dag = DagBag(dag_folder=str(REPO / "dags")).dags["realtime_rl_orgs"]
    dr = dag.test(run_conf={"start": START.isoformat(), "end": END.isoformat(), "min_episodes": 10**9})
    with create_session() as session:
        tis = session.query(TaskInstance).filter(TaskInstance.dag_id == dag.dag_id, TaskInstance.run_id == dr.run_id).all()
        states = {(ti.task_id, ti.map_index): str(ti.state) for ti in tis}
        judged = [XComModel.deserialize_value(x) for x in session.query(XComModel).filter(
            XComModel.dag_id == dag.dag_id, XComModel.run_id == dr.run_id, XComModel.task_id == "org_ab",
            XComModel.key == "return_value")]
    assert states[("org_ab", 0)] == "success" and ("org_ab", 1) not in states, "one live adapter, one judgement"
    assert states[("org_targets", -1)] == "success" and states[("report", -1)] == "success", states
    assert [(j["org"], j["decision"], j["action"]) for j in judged] == [("org-acme", "rollback", "rollback")], judged
    assert live_adapter(cfg, "org-acme") is None, "the worse adapter is off acme's traffic"
    assert store.get_version(adapter_registry(cfg, "org-acme"), av.version).tags["rolled_back"] == "true"
