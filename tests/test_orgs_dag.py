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

from rl_core.lake import Lake
from rl_core.schema import to_table
from rl_core.testing.synth import feedback_row, interaction_row, window

REPO = Path(__file__).resolve().parent.parent
START, END = window()


def test_dag_maps_adapt_org_over_orgs_and_reports_whatever_happens():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert not bag.import_errors, bag.import_errors
    dag = bag.dags["realtime_rl_orgs"]
    assert set(dag.task_ids) == {"window", "org_targets", "adapt_org", "report"}
    adapt = dag.get_task("adapt_org")
    assert type(adapt).__name__.endswith("MappedOperator") and adapt.pool == "rtrl_training"
    assert dag.get_task("report").trigger_rule == "all_done"
    assert "adapt_org" in dag.get_task("org_targets").downstream_task_ids


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

    from rl_core.cycle import run_id_for
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
