"""
### realtime_rl: one rtrl improvement cycle every few hours

Every run's data interval **is** its harvest window. On one grid (anchor 2026-01-01T00:00Z + k x 5 h,
GridTimetable) a scheduled run harvests the grid interval that just ended and a backfill (UI, REST or `airflow
backfill create`) one run per grid window inside its range that has ended (a window still open is left out);
Airflow names such a run after its window's end (`backfill__...T14:00`) and gives it the window's start as its
logical date. A manual run names its own window as its data interval (Trigger -> Data Interval: *Specify
Manually*; REST `data_interval_start`/`data_interval_end` with a `logical_date`; `rtrl cycle` does this), else it
gets the grid window that ended at or before its logical date. The `start`/`end` params are only for a run with
no data interval (Logical Date cleared): start/end that disagree with a data interval are refused at `window`, as
are start, end and policy_version on a backfill run. With "Unpause on trigger" ticked in the backfill dialog the
schedule starts at once and may take the latest ended window itself. The run id derives from the window, so the
same window always writes the same files under `runs/<run_id>/` (every stage is idempotent). The `window` task's
return value shows the rtrl run id beside the Airflow run id.

Stages (task groups): ab (served, monitors, rollback, ab_verdict) -> harvest (plan, part mapped over the
window's parts, harvest, gate_raw, exclude (drops a quarantined org's
episodes), gate_episodes) -> rewards (score, gate_rewards) -> train -> evaluate ->
promote (register, gate_promotion, deploy) -> outcome (all_done: the run's outcome in one line, its return value and
first log line, the run's note (the plugin's listener) and on the cycle's MLflow run; its state is the
outcome's: success, skipped when there was nothing to train on, failed when the run was refused or failed, so such a
run stays red). With `[harvest] map_hours` set, `part` maps over the window's
hours on as many workers and `harvest` merges them (the same episodes as one task). The live challenger is
judged first: the hacking monitors on every turn the window served, then, only if they pass, the A/B verdict
(a version that games the reward must not win on a metric the hack inflates); `rollback` takes a tripped
challenger off traffic. A failing gate fails its task without retry (its log's first line says why);
everything downstream ends `upstream_failed` and no other alias moves. A window with nothing to train on (no
traffic, or only episodes the policy's lineage already trained on: the ledger, rl_core/ledger.py) skips at
`harvest` with the reason, and the rest ends `skipped`.
The Assets (`rtrl_episodes` on gate_episodes, `rtrl_rewards` on gate_rewards, `rtrl_checkpoint` on train, `rtrl_eval` on
evaluate, `rtrl_registry` on register) are emitted by the task after which their stage is done, so a refused or
skipped window emits none for a stage it did not finish. The `rtrl_episodes` event carries the run's window in its
extra (run id, start, end, policy version, dry_run, Airflow run id): it schedules `realtime_rl_orgs`, which trains
the org adapters on exactly that window.
`dry_run` computes everything but leaves the registry alone (no A/B alias move, no registration, no deploy).

This file holds no business logic: every task calls rl_core (design.md, "the cycle contract").
"""

from __future__ import annotations

from dataclasses import asdict, replace
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Param, TaskGroup, dag, get_current_context, task
from airflow.sdk.exceptions import AirflowSkipException

# importable wherever Airflow runs: Airflow adds its plugins folder (AIRFLOW__CORE__PLUGINS_FOLDER) to the import path
from rtrl_operators import DataQualityGateOperator, DeepSpeedLaunchOperator
from rtrl_operators.rtrl_assets import CHECKPOINT, EPISODES, EVAL, REGISTRY, REWARDS
from rtrl_operators.grid_timetable import GridTimetable

from rl_core.config import load_config
from rl_core.lake import Lake
from rl_core.pipeline import check_dag
from rl_core.reports import read_verdict
from rl_core.runtime.procs import private_state
from rl_core.window import (
    PARAM_TS_HELP,
    PARAM_TS_MAX_LEN,
    PARAM_TS_PATTERN,
    SCHEDULE_ANCHOR,
    CycleRun,
    resolve_window,
)

# Every task process parses this file before it runs its task: from here on what it writes (lake files, verdicts,
# reports, checkpoints) is its user's alone (umask 077), as under the `rtrl` command (rl_core/cli.py).
private_state()
AF = load_config().airflow  # parse time reads only schedule, pool and retries; tasks load the config afresh


IO_RETRIES = {  # I/O-bound tasks: lake, MLflow, a flaky network on production stores
    "retries": AF.retries,
    "retry_delay": timedelta(seconds=AF.retry_delay_s),
    "retry_exponential_backoff": 2.0,
    "max_retry_delay": timedelta(minutes=30),
}
HEAVY = {"pool": AF.training_pool, "retries": 1, "retry_delay": timedelta(seconds=AF.retry_delay_s)}

# The trigger and backfill dialogs show these under each param (Run Parameters). The single-run params have their own
# section: the `window` task refuses them on a backfill run (rl_core.window.check_backfill_params).
SINGLE_RUN = "Single run only (a backfill refuses these)"
WINDOW_PARAM_HELP = (PARAM_TS_HELP + ". **Only for a run without a data interval** (Logical Date cleared); leave it "
                     "empty otherwise: the data interval is the window (Data Interval: *Specify Manually*), and a "
                     "start/end that disagree with it are refused.")
DRY_RUN_HELP = ("compute everything, move no alias, register nothing.\n\n**Backfill**: one run per grid window inside "
                "the range *that has ended*: a window still open is left out (and not counted). With *Unpause on "
                "trigger* ticked the schedule starts at once and may take the latest ended window as its own "
                "scheduled run (catchup is off) before the backfill does: the backfill then makes one run fewer than "
                "it counted, and the two run side by side (a backfill's runs have their own Max Active Runs). Untick "
                "it to keep every window in the backfill. A backfill refuses start, end and policy_version.")


@task(retries=0, doc_md="Resolve the harvest window and rtrl run id (`runs/<run_id>/` in the lake, the `run_id` "
                        "tag in MLflow): the run's data interval (the start/end params only for a run without one); "
                        "its return value shows both ids. Refuses, with why, a window longer than [harvest] "
                        "max_window_hours, start/end that disagree with the data interval, and single-run params "
                        "on a backfill run.")
def window() -> dict:
    from airflow.sdk.exceptions import AirflowFailException  # lazy: keeps DAG parsing light

    ctx = get_current_context()
    run_type = ctx["dag_run"].run_type
    try:
        w = resolve_window(ctx["params"], ctx.get("data_interval_start"), ctx.get("data_interval_end"),
                           AF.schedule_hours, max_hours=load_config().harvest.max_window_hours,
                           run_type=str(getattr(run_type, "value", run_type)))
    except ValueError as exc:  # the first log line, and the reason `outcome` states (no retry: it cannot change)
        print(f"REFUSED: {exc}")
        ctx["ti"].xcom_push("refused", str(exc))
        raise AirflowFailException(str(exc)) from exc
    # Airflow 3.3 gives a task no way to set its run's note, so the two ids meet here (first log line and the
    # return value) and on the MLflow version and training run (tags airflow.run_id, run_id) at register.
    print(f"rtrl run {w.run_id}: window [{w.start.isoformat()}, {w.end.isoformat()}) of Airflow run {ctx['run_id']}")
    p = ctx["params"]
    return CycleRun(w, bool(p.get("dry_run")), p.get("policy_version"), p.get("map_hours"), ctx["run_id"]).to_xcom()


@task(**IO_RETRIES, doc_md="Harvest and score every turn the window served, by every version (`<run_id>-served`): "
                           "what the monitors judge.")
def served(w: dict) -> dict:
    from rl_core.registry.store import known_versions, version_for_alias  # lazy: keeps DAG parsing light
    from rl_core.rewards.monitors import score_served

    cfg = load_config()
    champion = version_for_alias(cfg, "champion")
    if champion is None:
        raise RuntimeError("no `champion` alias: run `rtrl init` first")
    win = CycleRun.from_xcom(w).window
    run = score_served(cfg, win.run_id, win.start, win.end, max(known_versions(cfg), default=champion))
    print(f"served turns of every version scored under {run}; monitors' parent: the champion, version {champion}")
    return {"parent_version": int(champion)}


@task(**IO_RETRIES, trigger_rule="all_done",
      doc_md="The monitors' consequence: a tripped live challenger leaves traffic (alias removed, tagged "
             "rolled_back); the monitor rates go on each judged version's MLflow run.")
def rollback(w: dict) -> str:
    from rl_core.registry import card, promote  # lazy: keeps DAG parsing light

    if not w:  # all_done: it runs after a refused `window` too, which returned nothing
        return "no window (the window task failed): nothing to do"
    cfg, run = load_config(), CycleRun.from_xcom(w)
    verdict = read_verdict(Lake(cfg.lake_root), run.run_id, "monitors")
    if verdict is None:
        return "the monitors did not judge (an upstream task failed): nothing to do"
    action = promote.take_off_tripped(cfg, verdict, dry_run=run.dry_run)
    if not run.dry_run:
        card.log_monitors(cfg, verdict)
    print(action)
    return action


@task(**IO_RETRIES, doc_md="A/B verdict for the live challenger from logged outcomes (only once the monitors "
                           "passed); promote, roll back or keep collecting.")
def ab_verdict(w: dict) -> dict:
    from rl_core.ab.verdict import ab_verdict as compute  # lazy: keeps DAG parsing light
    from rl_core.ab.verdict import apply_verdict

    cfg, run = load_config(), CycleRun.from_xcom(w)
    result = compute(cfg, run.window.start, run.window.end)
    action = "dry-run: not applied" if run.dry_run else apply_verdict(cfg, result)
    print(f"A/B {result.decision}: {'; '.join(result.reasons)} (n={result.n})\naction: {action}")
    if not any(result.n.values()):
        print("no requests on either arm in the window: no A/B analysis logged to MLflow")
    return {"action": str(action), "decision": result.decision, "n": dict(result.n), "reasons": list(result.reasons)}


@task(**IO_RETRIES,
      doc_md="The policy version to update (the `policy_version` param, else the champion) and the window's parts "
             "for the mapped harvest: one per `map_hours` hours (the param, else `[harvest] map_hours`), or the "
             "whole window when it is 0.")
def plan(w: dict, _ab: dict) -> list[dict]:
    from rl_core.harvest import plan_parts  # lazy: keeps DAG parsing light
    from rl_core.registry.store import version_for_alias

    cfg, run = load_config(), CycleRun.from_xcom(w)
    policy = run.policy_version or version_for_alias(cfg, "champion")
    if policy is None:
        raise RuntimeError("no policy_version param and no `champion` alias: run `rtrl init` first")
    win, hours = run.window, cfg.harvest.map_hours if run.map_hours is None else run.map_hours
    parts = plan_parts(win.start, win.end, hours, cfg.harvest.granularity)
    print(f"policy v{policy}; {len(parts)} part(s) of [{win.start.isoformat()}, {win.end.isoformat()})")
    planned = replace(run, policy_version=int(policy))
    return [planned.to_xcom(part=[a.isoformat(), b.isoformat()]) for a, b in parts]


@task(**IO_RETRIES, map_index_template="{{ part_label }}",
      doc_md="Harvest one part of the window (its own hour partitions of the lake, the window's feedback), on "
             "whichever worker takes it; a window planned as one part is written in place.")
def part(job: dict) -> dict:
    from rl_core.harvest import harvest as run_harvest  # lazy: keeps DAG parsing light
    from rl_core.ledger import lineage_of

    cfg, run = load_config(), CycleRun.from_xcom(job)
    win, policy = run.window, run.policy
    lo, hi = (datetime.fromisoformat(ts) for ts in job["part"])  # plan's own ISO stamps, UTC
    get_current_context()["part_label"] = f"{lo:%H:%M}-{hi:%H:%M}"  # type: ignore[typeddict-unknown-key]
    whole = (lo, hi) == (win.start, win.end)
    r = run_harvest(cfg, win.start, win.end, policy, win.run_id, lineage=lineage_of(cfg, policy),
                    part=None if whole else (lo, hi))
    print(f"part [{lo.isoformat()}, {hi.isoformat()}): {r.n_episodes} episodes of {r.n_interactions} interactions")
    return asdict(r)


@task(**IO_RETRIES, multiple_outputs=True,
      doc_md="Episodes of the policy version in the window, feedback joined, less those its lineage already "
             "trained on (the ledger): the parts merged in time order. Skips the rest of the cycle, with the "
             "reason, when there is nothing new.")
def harvest(w: dict, parts: list[dict]) -> dict:
    from rl_core.harvest import HarvestResult, merge_parts  # lazy: keeps DAG parsing light

    run = CycleRun.from_xcom(w)
    win = run.window
    r = merge_parts(load_config(), win.start, win.end, win.run_id, [HarvestResult(**p) for p in parts])
    reason = r.skip_reason()
    if reason:  # skipped, not failed: an empty or already-trained window is not an error
        print(f"SKIPPED: {reason}\nharvest: {r}")
        raise AirflowSkipException(reason)
    print(f"harvest: {r}")
    return replace(run, policy_version=r.policy_version).to_xcom(episodes=int(r.n_episodes))


@task(**IO_RETRIES, doc_md="Drop the episodes of an org that gate_raw quarantined (its rows alone broke row-level "
                           "checks), so one org's bad data never refuses the others' window.")
def exclude(w: dict) -> int:
    from rl_core.exclude import exclude as drop  # lazy: keeps DAG parsing light

    n = drop(load_config(), CycleRun.from_xcom(w).run_id)
    print(f"exclude: {n} episodes of quarantined orgs dropped" if n else "exclude: no org quarantined")
    return n


@task(**IO_RETRIES, doc_md="Score every episode (SQL signals + Python scorers) into a reward.")
def score(w: dict) -> dict:
    from rl_core.rewards import score_run  # lazy: keeps DAG parsing light

    r = score_run(load_config(), CycleRun.from_xcom(w).run_id)
    print(f"rewards: {r}")
    return {"mean_reward": float(getattr(r, "mean_reward", float("nan")))}


@task(pool=AF.training_pool, retries=1, outlets=[EVAL], doc_md="Paired eval: candidate vs its parent on the suite.")
def evaluate(w: dict, trained: dict) -> dict:
    from evals.compare import evaluate as run_eval  # lazy: keeps DAG parsing light

    run = CycleRun.from_xcom(w)
    cmp = run_eval(load_config(), run.run_id, trained["checkpoint"], run.policy)
    deltas = {m.metric: round(m.mean_diff, 4) for m in cmp.metrics}
    print(f"eval {cmp.verdict}: deltas {deltas}; " + "; ".join(cmp.reasons))
    return {"verdict": cmp.verdict, "passed": cmp.passed, "deltas": deltas}  # a regression blocks at gate_promotion


@task(**IO_RETRIES, outlets=[REGISTRY], doc_md="Register the checkpoint as a new MLflow version with lineage tags.")
def register(w: dict, _evaluated: dict) -> int | None:
    from rl_core.ledger import EpisodesConsumed  # lazy: keeps DAG parsing light
    from rl_core.registry.register import register_run

    run = CycleRun.from_xcom(w)
    if run.dry_run:
        raise AirflowSkipException("dry run: nothing registered")
    try:  # the Airflow run goes on the version and on the trainer's MLflow run
        version = int(register_run(load_config(), run.run_id, tags={"airflow.dag_id": AF.dag_id,
                                                                     "airflow.run_id": run.airflow_run_id}))
    except EpisodesConsumed as exc:  # another run registered these episodes while this one trained
        print(f"SKIPPED: {exc}")
        raise AirflowSkipException(str(exc)) from exc
    print(f"registered version {version}")
    return version


@task(**IO_RETRIES, doc_md="Alias `challenger` -> the new version (only after every gate passed).")
def deploy(w: dict, version: int, _gate: dict) -> dict:
    from rl_core.registry.deploy import deploy as run_deploy  # lazy: keeps DAG parsing light

    moved = bool(run_deploy(load_config(), CycleRun.from_xcom(w).run_id, int(version)))
    print(f"deploy version {version}: alias challenger {'moved' if moved else 'NOT moved'}")
    return {"version": int(version), "challenger": moved}


@task(trigger_rule="all_done", retries=0,
      doc_md="The run's outcome in one line, the first of this log and the return value (`skipped: why`, `refused "
             "by <gate>: <reason>`, `failed at <task>`, `registered vN -> challenger`, and the A/B decision with "
             "per-arm counts); the same on the cycle's MLflow run (experiment `<experiment>-cycles`). Its state is "
             "the outcome's, the grid's last column: success, skipped (nothing to train on), failed (refused or "
             "failed, so the run stays red). The rtrl plugin's listener makes the line the run's note.")
def outcome() -> str:
    from airflow.sdk.exceptions import AirflowFailException  # lazy: keeps DAG parsing light

    from rl_core.outcome import record, settle

    ctx = get_current_context()
    ti, cfg = ctx["ti"], load_config()
    w, ab = ti.xcom_pull(task_ids="window"), ti.xcom_pull(task_ids="ab.ab_verdict")
    run = CycleRun.from_xcom(w) if w else None
    states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id]).get(ti.run_id, {})
    result = settle(cfg, run.run_id if run else None, states, ab, dry_run=bool(run and run.dry_run))
    refused = None if run else ti.xcom_pull(task_ids="window", key="refused")  # the window task said why
    line = f"refused by window: {refused}" if refused else result.line
    print(line)
    if run is not None:
        win = f"[{run.window.start.isoformat()}, {run.window.end.isoformat()})"
        print(f"MLflow run {record(cfg, result, run.run_id, win, ctx['run_id'])} (experiment {cfg.mlflow.experiment}-cycles)")
    if not result.ok or result.kind == "skipped":  # the return value first: a task that raises returns nothing
        ti.xcom_push("return_value", line)
        raise (AirflowSkipException if result.ok else AirflowFailException)(line)
    return line


def announce_episodes(context: Any, _result: Any = None) -> None:
    """gate_episodes' post_execute hook: its rtrl_episodes event carries the run's window (run id, start, end, the
    policy version harvested for, dry_run, the Airflow run id) in its extra, and realtime_rl_orgs, scheduled on that
    Asset, trains on exactly that window instead of deriving one of its own. The hook runs only after the gate
    passed, and Airflow records a task's asset events only when it succeeds: a refused or skipped run emits none."""
    context["outlet_events"][EPISODES].extra = CycleRun.from_xcom(context["task"].window).to_xcom()


@dag(
    dag_id=AF.dag_id,
    schedule=GridTimetable(AF.schedule_hours, SCHEDULE_ANCHOR),  # data interval = harvest window, on the grid
    start_date=SCHEDULE_ANCHOR,
    catchup=False,
    max_active_runs=1,
    default_args={"owner": "rtrl", "retries": 0},
    tags=["rtrl"],
    doc_md=__doc__,
    params={
        "start": Param(None, type=["null", "string"], format="date-time", pattern=PARAM_TS_PATTERN,
                       maxLength=PARAM_TS_MAX_LEN, section=SINGLE_RUN, description_md=WINDOW_PARAM_HELP.format("start")),
        "end": Param(None, type=["null", "string"], format="date-time", pattern=PARAM_TS_PATTERN,
                     maxLength=PARAM_TS_MAX_LEN, section=SINGLE_RUN, description_md=WINDOW_PARAM_HELP.format("end")),
        "policy_version": Param(None, type=["null", "integer"], minimum=1, maximum=2**31 - 1, section=SINGLE_RUN,
                                description="version to update (default: champion); a backfill refuses it"),
        "dry_run": Param(False, type="boolean", description_md=DRY_RUN_HELP),
        "map_hours": Param(None, type=["null", "integer"], minimum=0,
                           description="harvest in parts of this many hours, one task each (default: [harvest] map_hours)"),
    },
)
def realtime_rl():
    w = window()
    with TaskGroup("ab", tooltip="judge the live challenger: hacking monitors, then the A/B verdict"):
        sv = served(w)
        mon = DataQualityGateOperator(task_id="monitors", check="monitors", window=w,
                                      extra={"parent_version": sv["parent_version"]},
                                      doc_md="Reward-hacking monitors: every served version versus the champion.")
        rb = rollback(w)
        ab = ab_verdict(w)
        sv >> mon >> rb
        [mon, rb] >> ab  # no A/B verdict is applied when the monitors refused
    with TaskGroup("harvest", tooltip="episodes + data-quality gates"):
        pl = plan(w, ab)
        parts = part.expand(job=pl)  # one mapped task per part of the window
        hw = harvest(w, parts)
        g_raw = DataQualityGateOperator(task_id="gate_raw", check="gate_raw", window=hw,
                                        doc_md="GX suite on the window's raw events; fails with the report.")
        g_ep = DataQualityGateOperator(task_id="gate_episodes", check="gate_episodes", window=hw, outlets=[EPISODES],
                                       post_execute=announce_episodes,  # the event's extra: the window
                                       doc_md="GX suite on episodes.parquet (lengths, logprobs, version lag); "
                                              "once it passes, the rtrl_episodes event carries the window to "
                                              "realtime_rl_orgs.")
        ex = exclude(hw)
        g_raw >> ex >> g_ep
    with TaskGroup("rewards", tooltip="rewards + gate"):
        sc = score(hw)
        g_rw = DataQualityGateOperator(task_id="gate_rewards", check="gate_rewards", window=hw, outlets=[REWARDS],
                                       doc_md="GX suite on rewards.parquet (finite, in range, hash).")
        g_ep >> sc >> g_rw
    with TaskGroup("train", tooltip="DeepSpeed update in its own processes"):
        tr = DeepSpeedLaunchOperator(task_id="train", rtrl_run_id=hw["run_id"], base_version=hw["policy_version"],
                                     outlets=[CHECKPOINT], **HEAVY,
                                     doc_md="`rtrl train` as its own process group; log streamed; `train` verdict.")
        g_rw >> tr
    with TaskGroup("evaluate", tooltip="paired eval suite"):
        ev = evaluate(hw, tr.output)
    with TaskGroup("promote", tooltip="register -> promotion gate -> challenger"):
        version = register(hw, ev)
        gate = DataQualityGateOperator(task_id="gate_promotion", check="gate_promotion", window=hw,
                                       doc_md="Every required verdict must pass; else nothing moves.")
        version >> gate
        dp = deploy(hw, version, gate.output)
    # all_done on every task, not only deploy: deploy ends upstream_failed while an all_done task (rollback) may
    # still run. Each Asset is an outlet of the task after which its stage is done (a gate that passed), so a
    # refused or skipped run emits nothing for that stage.
    [w, sv, mon, rb, ab, pl, parts, hw, g_raw, ex, g_ep, sc, g_rw, tr, ev, version, gate, dp] >> outcome()


check_dag(realtime_rl())  # the tasks above are rl_core.pipeline.CYCLE, in its order: a drift fails the import
