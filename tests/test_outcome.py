"""A cycle's outcome in one line (rl_core/outcome.py), from task states as Airflow gives them and from what the
stages left in the real lake and the real MLflow registry (SQLite); and the A/B runs that line reports on.
The DAG's `outcome` task on real runs: tests/test_dag_run.py and tests/test_dag_operator_view.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rl_core import pipeline
from rl_core.lake import Lake
from rl_core.outcome import ab_part, record, settle, short_states
from rl_core.reports import Verdict, write_verdict

RUN_ID = "cycle-20261202T1000"
START = datetime(2026, 12, 2, 5, tzinfo=UTC)
END = START + timedelta(hours=5)
WINDOW = f"[{START.isoformat()}, {END.isoformat()})"
STAGES = [s for s in pipeline.CYCLE if s != "outcome"]
GROUP = {"served": "ab", "monitors": "ab", "rollback": "ab", "ab_verdict": "ab", "plan": "harvest", "part": "harvest",
         "harvest": "harvest", "gate_raw": "harvest", "exclude": "harvest", "gate_episodes": "harvest",
         "score": "rewards", "gate_rewards": "rewards", "train": "train", "evaluate": "evaluate",
         "register": "promote", "gate_promotion": "promote", "deploy": "promote"}


def states(**at: str) -> dict[str, str]:
    """Airflow's task ids (groups, a mapped `part` as `<id>_<index>`) -> state: success until the first stage
    named, that stage's state, then `rest` (default upstream_failed) for the ones after it."""
    rest = at.pop("rest", "upstream_failed")
    out, state = {}, "success"
    for stage in STAGES:
        if stage in at:
            state = at[stage]
        tid = f"{GROUP[stage]}.{stage}" if stage in GROUP else stage
        out[f"{tid}_0" if stage == "part" else tid] = state
        if stage in at:
            state = rest
    out["outcome"] = "running"
    return out


def manifest(cfg, **counts) -> None:
    lake = Lake(cfg.lake_root)
    values = dict(run_id=RUN_ID, path="", start=START.isoformat(), end=END.isoformat(), policy_version=1,
                  granularity="hour", n_interactions=0, n_episodes=0, n_stale=0, n_with_feedback=0,
                  n_interaction_files=0, n_feedback_files=0, parts=1)
    lake.write_json(lake.run(RUN_ID).manifest, {**values, **counts})


def test_short_states_take_a_mapped_tasks_worst_instance():
    assert short_states({"harvest.part_0": "success", "harvest.part_1": "failed", "window": "success"}) == {
        "part": "failed", "window": "success"}


def test_a_window_without_traffic_is_skipped_with_the_manifests_reason(cfg):
    manifest(cfg)
    out = settle(cfg, RUN_ID, states(harvest="skipped", rest="skipped"))
    assert out.kind == "skipped" and out.ok
    assert out.line == f"skipped: no traffic in {WINDOW}: the lake has no interaction in this window, nothing to train on"


def test_a_refusing_gate_is_named_with_its_first_reason(cfg):
    write_verdict(Lake(cfg.lake_root), RUN_ID, Verdict(name="gate_raw", passed=False,
                                                          reasons=["logprob <= 0: 5 rows", "event_id unique: 4 dups"]))
    out = settle(cfg, RUN_ID, states(gate_raw="failed"))
    assert (out.kind, out.line, out.ok) == ("refused", "refused by gate_raw: logprob <= 0: 5 rows", False)
    # the promotion gate writes the verdict `promotion`; its task is gate_promotion
    write_verdict(Lake(cfg.lake_root), RUN_ID, Verdict(name="promotion", passed=False, reasons=["eval: regression"]))
    assert settle(cfg, RUN_ID, states(gate_promotion="failed")).line == "refused by gate_promotion: eval: regression"


def test_a_task_that_failed_without_a_refusal_is_named(cfg):
    out = settle(cfg, RUN_ID, states(part="failed"))
    assert (out.kind, out.line, out.ok) == ("failed", "failed at part", False)
    assert settle(cfg, None, {"window": "failed"}).line == "failed at window"


def test_a_registered_version_and_the_ab_decision_with_its_counts(registered):
    from rl_core.registry import store

    cfg = registered
    v2 = store.register_checkpoint(cfg, store.checkpoint_path(cfg, 1), run_name="v2", tags={"run_id": RUN_ID})
    store.set_alias(cfg, "challenger", v2, "test: deployed")
    ab = {"decision": "continue", "action": "continue", "n": {"champion": 85, "challenger": 0},
          "reasons": ["challenger: 0 < min_samples_per_arm 50"]}
    out = settle(cfg, RUN_ID, states(), ab)
    assert out.kind == "registered" and out.version == v2 and out.ok
    assert out.line == (f"registered v{v2} -> challenger | A/B continue (champion n=85, challenger n=0): "
                        "challenger: 0 < min_samples_per_arm 50")
    assert settle(cfg, RUN_ID, states(register="skipped", rest="skipped"), dry_run=True).kind == "dry_run"


def test_ab_part_is_empty_without_a_verdict_and_names_an_action_that_differs():
    assert ab_part(None) == "" and ab_part({}) == ""
    assert ab_part({"decision": "promote", "action": "stale", "n": {"champion": 3, "challenger": 4},
                    "reasons": []}) == "A/B promote (champion n=3, challenger n=4); action stale"


def test_every_window_has_one_mlflow_run_updated_in_place(cfg):
    from rl_core.registry import store

    manifest(cfg)
    skipped = settle(cfg, RUN_ID, states(harvest="skipped", rest="skipped"))
    first = record(cfg, skipped, RUN_ID, WINDOW, "scheduled__2026-12-02T10:00:00+00:00")
    write_verdict(Lake(cfg.lake_root), RUN_ID, Verdict(name="gate_raw", passed=False, reasons=["bad rows"]))
    refused = settle(cfg, RUN_ID, states(gate_raw="failed"))
    again = record(cfg, refused, RUN_ID, WINDOW, "manual__rerun")
    assert again == first  # the same window, the same run
    c = store.client(cfg)
    exp = c.get_experiment_by_name(cfg.mlflow.experiment + "-cycles")
    runs = c.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_name == RUN_ID and run.info.status == "FAILED"
    tags = run.data.tags
    assert (tags["outcome"], tags["reason"], tags["window"], tags["airflow.run_id"], tags["run_id"]) == (
        "refused", "gate_raw: bad rows", WINDOW, "manual__rerun", RUN_ID)
    assert tags["mlflow.note.content"] == "refused by gate_raw: bad rows"


# --- the A/B runs the outcome reports on -----------------------------------------------------------------------

def test_an_ab_window_without_requests_logs_no_mlflow_run(cfg):
    from rl_core.ab.verdict import ab_verdict
    from rl_core.registry import store

    r = ab_verdict(cfg, START, END, champion=1, challenger=2)
    assert r.n == {"champion": 0, "challenger": 0} and not r.mlflow_run_id
    exp = store.client(cfg).get_experiment_by_name(cfg.mlflow.experiment + "-ab")
    assert exp is None or not store.client(cfg).search_runs([exp.experiment_id])


def test_an_ab_run_is_named_like_a_cycle_run_id(registered):
    from lab.testing import ab_synth
    from lab.testing.ab_synth import ArmSpec
    from rl_core.ab.verdict import ab_verdict
    from rl_core.registry import store

    cfg = registered
    v2 = store.register_checkpoint(cfg, store.checkpoint_path(cfg, 1), run_name="v2", tags={"run_id": "r2"})
    events, feedback = ab_synth.synth_ab(60, 30, START, END, ArmSpec(1), ArmSpec(v2), seed=2)
    lake = Lake(cfg.lake_root)
    ab_synth.write_to_lake(lake, "interactions", events)
    ab_synth.write_to_lake(lake, "feedback", feedback)
    r = ab_verdict(cfg, START, END, champion=1, challenger=v2)
    assert min(r.n.values()) > 0
    run = store.client(cfg).get_run(r.mlflow_run_id)
    assert run.info.run_name == "ab-20261202T0500-20261202T1000"
