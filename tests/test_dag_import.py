"""The realtime_rl DAG parses, is acyclic, and is wired the way the cycle contract says.

No stage runs here: these tests hold even before the stages exist, because the DAG imports rl_core
stage modules only inside its tasks.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def load_dag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags")).dags["realtime_rl"]


STAGES = [  # the cycle, in order: each stage must be downstream of every earlier one
    "window", "ab.served", "ab.monitors", "ab.rollback", "ab.ab_verdict", "harvest.plan", "harvest.part",
    "harvest.harvest", "harvest.gate_raw", "harvest.exclude", "harvest.gate_episodes", "rewards.score", "rewards.gate_rewards", "train.train", "evaluate.evaluate",
    "promote.register", "promote.gate_promotion", "promote.deploy", "outcome",
]
GATES = {"harvest.gate_raw", "harvest.gate_episodes", "rewards.gate_rewards", "ab.monitors",
         "promote.gate_promotion"}
IO_TASKS = {"ab.served", "ab.rollback", "ab.ab_verdict", "harvest.plan", "harvest.part", "harvest.harvest", "harvest.exclude",
            "rewards.score", "promote.register", "promote.deploy"}
HEAVY_TASKS = {"train.train", "evaluate.evaluate"}


@pytest.fixture(scope="module")
def dag():
    return load_dag()


def test_dagbag_has_no_import_errors():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    assert "realtime_rl" in bag.dags


def test_tasks_are_the_cycle_in_order_and_acyclic(dag):
    from rl_core import pipeline

    assert [t.split(".")[-1] for t in STAGES] == list(pipeline.CYCLE)  # the DAG follows the one definition
    assert {t.split(".")[-1] for t in GATES} == {g.name for g in pipeline.GATES}
    assert set(dag.task_ids) == set(STAGES)
    # Kahn's algorithm: every task gets scheduled exactly once -> no cycle
    indeg = {t.task_id: len(t.upstream_task_ids) for t in dag.tasks}
    ready, seen = [t for t, d in indeg.items() if d == 0], []
    while ready:
        tid = ready.pop()
        seen.append(tid)
        for down in dag.get_task(tid).downstream_task_ids:
            indeg[down] -= 1
            if indeg[down] == 0:
                ready.append(down)
    assert len(seen) == len(STAGES)
    for earlier, later in zip(STAGES, STAGES[1:], strict=False):
        assert earlier in dag.get_task(later).get_flat_relative_ids(upstream=True), f"{earlier} !-> {later}"


def test_schedule_is_a_data_interval_every_5_hours(dag):
    from rtrl_operators.grid_timetable import GridTimetable

    from rl_core.window import SCHEDULE_ANCHOR

    assert isinstance(dag.timetable, GridTimetable)  # on the grid: tests/test_dag_timetable.py
    assert dag.timetable.period == timedelta(hours=5) and dag.timetable.anchor == SCHEDULE_ANCHOR
    assert dag.catchup is False and dag.max_active_runs == 1


def test_retries_owner_pool_and_docs(dag):
    for t in dag.tasks:
        assert t.owner == "rtrl", t.task_id
        assert t.doc_md, f"{t.task_id} has no doc_md"
        if t.task_id in GATES:
            assert t.retries == 0, f"gate {t.task_id} must not retry (a rerun cannot change its answer)"
        elif t.task_id in IO_TASKS:
            assert t.retries == 2 and t.retry_exponential_backoff > 0, t.task_id
        elif t.task_id in HEAVY_TASKS:
            assert t.retries == 1 and t.pool == "rtrl_training", t.task_id
        if t.task_id not in HEAVY_TASKS:
            assert t.pool == "default_pool", t.task_id


def test_no_ab_verdict_is_applied_unless_the_monitors_passed(dag):
    """rollback runs whatever the monitors said (it acts on a trip); the A/B verdict needs the monitors' success
    itself, not only rollback's: a hack must not win an A/B verdict on the metric it inflates."""
    assert dag.get_task("ab.rollback").trigger_rule == "all_done"
    ab = dag.get_task("ab.ab_verdict")
    assert "ab.monitors" in ab.upstream_task_ids and ab.trigger_rule == "all_success"


def test_lake_outputs_are_assets(dag):
    outlets = {t.task_id: {a.name for a in t.outlets} for t in dag.tasks if t.outlets}
    assert outlets == {
        "harvest.gate_episodes": {"rtrl_episodes"}, "rewards.gate_rewards": {"rtrl_rewards"},
        "train.train": {"rtrl_checkpoint"}, "evaluate.evaluate": {"rtrl_eval"},
        "promote.register": {"rtrl_registry"},
    }  # each on the task after which its stage is done: episodes and rewards once their gate passed


def test_the_outcome_task_runs_last_whatever_happened(dag):
    """all_done, directly downstream of every task: deploy alone would let it start while an all_done task
    (rollback) still runs; no retry (it only reads); the last of the cycle."""
    from rl_core import pipeline

    out = dag.get_task("outcome")
    assert out.trigger_rule == "all_done" and out.retries == 0
    assert out.upstream_task_ids == set(dag.task_ids) - {"outcome"}
    assert [t.task_id for t in dag.leaves] == ["outcome"] and pipeline.CYCLE[-1] == "outcome"


def test_gates_use_the_quality_operator_and_train_the_launcher(dag):
    from rtrl_operators import DataQualityGateOperator, DeepSpeedLaunchOperator

    for tid in GATES:
        assert isinstance(dag.get_task(tid), DataQualityGateOperator)
    assert isinstance(dag.get_task("train.train"), DeepSpeedLaunchOperator)


def test_params_validate():
    import copy

    from airflow.sdk.exceptions import ParamValidationError

    params = load_dag().params
    assert copy.deepcopy(params).validate() == {"start": None, "end": None, "policy_version": None, "dry_run": False,
                                                "map_hours": None}
    good = copy.deepcopy(params)
    good["policy_version"], good["start"] = 3, "2026-12-02T10:00:00+00:00"
    assert good.validate()["policy_version"] == 3
    for key, bad in [("policy_version", 0), ("policy_version", "two"), ("dry_run", "yes"), ("start", 5),
                     ("map_hours", -1), ("map_hours", "hourly")]:
        broken = copy.deepcopy(params)
        with pytest.raises(ParamValidationError, match=key):
            broken[key] = bad
            broken.validate()


# --- the window: data interval or params -> harvest window + run id --------------------------------

UTC = timezone.utc


def test_window_from_data_interval_and_params():
    from lab.cycle import resolve_window

    s, e = datetime(2026, 12, 2, 5, tzinfo=UTC), datetime(2026, 12, 2, 10, tzinfo=UTC)
    w = resolve_window({}, s, e, 5)
    assert (w.start, w.end, w.run_id) == (s, e, "cycle-20261202T1000")
    assert resolve_window({}, s, e, 5) == w  # same window, same run id
    m = resolve_window({"start": "2026-12-02T09:00:00Z", "end": "2026-12-02T09:30:15+00:00"}, s, e, 5)
    assert m.start == datetime(2026, 12, 2, 9, tzinfo=UTC)
    assert m.run_id == "cycle-20261202T0900-20261202T093015"


def test_window_without_interval_is_last_complete_one():
    from lab.cycle import resolve_window

    w = resolve_window({}, None, None, 5, now=datetime(2026, 1, 1, 12, 34, tzinfo=UTC))
    assert (w.start, w.end) == (datetime(2026, 1, 1, 5, tzinfo=UTC), datetime(2026, 1, 1, 10, tzinfo=UTC))


@pytest.mark.parametrize("params, match", [
    ({"start": "2026-12-02T09:00:00Z"}, "go together"),
    ({"start": "2026-12-02T09:00:00", "end": "2026-12-02T10:00:00"}, "timezone"),
    ({"start": "yesterday", "end": "2026-12-02T10:00:00Z"}, "start='yesterday'"),
    ({"start": "2026-12-02T10:00:00Z", "end": "2026-12-02T09:00:00Z"}, "must be after"),
])
def test_bad_window_params_name_the_field(params, match):
    from lab.cycle import resolve_window

    with pytest.raises(ValueError, match=match):
        resolve_window(params, None, None, 5)


def test_a_standalone_cycle_waits_for_the_previous_window_to_end(cfg):
    """`rtrl cycle` / `rtrl experiment` windows are the traffic's minutes rounded outwards; a cycle that starts
    soon after the last one waits, so two windows never share a turn (it would be counted twice)."""
    import time
    from datetime import UTC, datetime, timedelta

    from lab.cycle import wait_for_window

    assert wait_for_window(cfg) == 0.0  # first cycle: nothing to wait for
    cfg.home_path.mkdir(parents=True, exist_ok=True)
    (cfg.home_path / "cycle-window-end").write_text((datetime.now(UTC) + timedelta(seconds=1.5)).isoformat())
    t = time.monotonic()
    waited = wait_for_window(cfg)
    assert 1.0 < waited <= 1.5 and time.monotonic() - t >= 1.0
    assert datetime.now(UTC) >= datetime.fromisoformat((cfg.home_path / "cycle-window-end").read_text())


def test_a_dag_that_drifts_from_the_cycle_fails_its_import():
    """realtime_rl calls pipeline.check_dag when parsed: a task missing, or two in the wrong order, is refused."""
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG, chain

    from rl_core import pipeline

    def dag_of(dag_id: str, names: list[str]):
        with DAG(dag_id, schedule=None) as d:
            chain(*(EmptyOperator(task_id=n) for n in names))
        return d

    pipeline.check_dag(dag_of("same", list(pipeline.CYCLE)))
    with pytest.raises(ValueError, match="not pipeline.CYCLE"):
        pipeline.check_dag(dag_of("skips_a_gate", [n for n in pipeline.CYCLE if n != "gate_rewards"]))
    swapped = list(pipeline.CYCLE)
    i, j = swapped.index("gate_raw"), swapped.index("gate_episodes")
    swapped[i], swapped[j] = swapped[j], swapped[i]
    with pytest.raises(ValueError, match="(exclude|gate_episodes) must run after"):
        pipeline.check_dag(dag_of("swapped", swapped))


def test_the_cycle_run_is_one_typed_value_on_the_wire_and_back():
    """Each task reads its run back as a CycleRun; on the wire it is plain JSON that the gate operators read by key."""
    import json

    from rl_core.window import CycleRun, Window

    w = Window(datetime(2026, 12, 2, 5, tzinfo=UTC), datetime(2026, 12, 2, 10, tzinfo=UTC), "cycle-20261202T1000")
    run = CycleRun(w, dry_run=True, policy_version=None, map_hours=1, airflow_run_id="manual__x")
    wire = json.loads(json.dumps(run.to_xcom(part=["a", "b"])))
    assert wire["run_id"] == "cycle-20261202T1000" and wire["start"] == "2026-12-02T05:00:00+00:00"
    assert CycleRun.from_xcom(wire) == run and wire["part"] == ["a", "b"]
    with pytest.raises(ValueError, match="no policy version resolved"):
        _ = run.policy
    assert CycleRun.from_xcom({**wire, "policy_version": 3}).policy == 3
