"""
### realtime_rl_orgs: per-organisation LoRA adapters, one mapped task per organisation

Scheduled on the `rtrl_episodes` Asset: a `realtime_rl` run whose episodes were harvested and passed gate_raw and
gate_episodes emits it, with its window in the event's extra (run id, start, end, the policy version harvested for,
dry_run), and this DAG's run trains on exactly that window and those episodes (the cycle's file, gated and with a
quarantined org's episodes excluded: no second harvest). A refused or skipped cycle emits no event, so no org run
follows it. Should several events queue while a run is busy (max one active run), the next run takes the newest
window and names the windows it leaves out in the `window` task's log (run those by hand). A manual run names its
window with the `start`/`end` params (a backfill of one window; else its data interval, else the latest grid
window) and harvests it itself.

Each live adapter is judged: `org_ab`, mapped over the orgs with a live adapter, runs the org's A/B on the window
(the adapter's users against the org's users on the base alone, `[orgs] ab_share`) and carries it out: promote
keeps it live, rollback takes it off the org's traffic (seconds; should a new adapter of the org go live first, the
verdict is stale and moves nothing). Beside it, `org_targets` lists the orgs with enough episodes and `adapt_org`
is mapped over them (dynamic task mapping); a failed A/B stops no org's training.
Each org is its own task instance: its episodes only, a LoRA update of the champion, paired evals on the
shared suite and on the org's tasks, registration as `rtrl-adapter-<org>` and the `live` alias when every
adapter verdict passed. A failing org fails its own instance; the others still train, evaluate and deploy;
`report` runs whatever happened (trigger rule all_done) and lists each org's outcome.
A DAG of its own rather than a branch of `realtime_rl`: an org's failure must not fail the cycle's run,
and the cycle's promotion path stays exactly as it is. This file holds no business logic (rl_core/orgs).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task
from rtrl_operators.rtrl_assets import EPISODES  # realtime_rl's gate_episodes emits it

from rl_core.config import load_config
from rl_core.lake import Lake
from rl_core.pipeline import ORG_CYCLE, check_dag
from rl_core.runtime.procs import private_state
from rl_core.window import (
    PARAM_TS_HELP,
    PARAM_TS_MAX_LEN,
    PARAM_TS_PATTERN,
    SCHEDULE_ANCHOR,
    CycleRun,
    check_window,
    resolve_window,
)

# Every task process parses this file before it runs its task: from here on what it writes (lake files, verdicts,
# reports, checkpoints) is its user's alone (umask 077), as under the `rtrl` command (rl_core/cli.py).
private_state()
AF = load_config().airflow


def cycle_event(ctx: Any) -> Any | None:
    """The newest rtrl_episodes event that triggered this run (None for a manual run), the ones it leaves out named
    in the log: events that queued while a run was busy all land in the next run, which trains on one window."""
    try:
        events = list(ctx.get("triggering_asset_events", {})[EPISODES])
    except KeyError:
        return None
    events.sort(key=lambda e: e.timestamp)
    for old in events[:-1]:
        print(f"left out: the window of {old.source_dag_id} run {old.source_run_id} ({old.extra}); run this DAG "
              "by hand with its start/end to train on it")
    return events[-1] if events else None


def from_event(event: Any) -> CycleRun:
    """The window, policy version and dry_run of the realtime_rl run that emitted event (its extra), checked."""
    try:
        run = CycleRun.from_xcom(event.extra)
        check_window(run.window.start, run.window.end, load_config().harvest.max_window_hours)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"the rtrl_episodes event of {event.source_dag_id} run {event.source_run_id} names no "
                         f"window ({exc}; extra {event.extra!r}): trigger this DAG with start/end instead") from None
    print(f"triggered by {event.source_dag_id} run {event.source_run_id}: its window and episodes")
    return run


@task(retries=0, doc_md="The window and run id: the triggering rtrl_episodes event's (the realtime_rl run that "
                        "harvested and gated it), else the start/end params, else the data interval; and the "
                        "policy version (the event's, else the param, else the champion).")
def window() -> dict:
    from rl_core.registry.store import version_for_alias  # lazy: keeps DAG parsing light

    ctx = get_current_context()
    p, cfg = ctx["params"], load_config()
    event = cycle_event(ctx)
    if event is not None:
        src = from_event(event)
        w, policy, dry = src.window, src.policy_version, src.dry_run or bool(p.get("dry_run"))
    else:
        w = resolve_window(p, ctx.get("data_interval_start"), ctx.get("data_interval_end"), AF.schedule_hours,
                           max_hours=cfg.harvest.max_window_hours)
        policy, dry = p.get("policy_version"), bool(p.get("dry_run"))
    policy = policy or version_for_alias(cfg, "champion")
    if policy is None:
        raise RuntimeError("no policy_version param and no `champion` alias: run `rtrl init` first")
    print(f"rtrl run {w.run_id}: window [{w.start.isoformat()}, {w.end.isoformat()}) of Airflow run {ctx['run_id']}")
    return CycleRun(w, dry, int(policy), airflow_run_id=ctx["run_id"]).to_xcom(
        min_episodes=p.get("min_episodes"), cycle_run=event.source_run_id if event is not None else None)


@task(retries=AF.retries, retry_delay=timedelta(seconds=AF.retry_delay_s),
      doc_md="The orgs with a live adapter (served by a token, not opted out): each one's A/B is judged.")
def live_orgs() -> list[str]:
    from rl_core.orgs.branch import live_orgs as orgs  # lazy: keeps DAG parsing light

    return orgs(load_config())


@task(retries=AF.retries, retry_delay=timedelta(seconds=AF.retry_delay_s), map_index_template="{{ org }}",
      doc_md="The org's A/B on the window (its live adapter against its base), applied: promote keeps it live, "
             "rollback takes it off the org's traffic. Fails only this org's instance.")
def org_ab(w: dict, org: str) -> dict:
    from rl_core.orgs.branch import judge_org  # lazy: keeps DAG parsing light

    run = CycleRun.from_xcom(w)
    out = judge_org(load_config(), run.window.start, run.window.end, org, dry_run=run.dry_run)
    print(f"org {org}: A/B {out['decision']} on {out['adapter_version']}: {'; '.join(out['reasons'])} "
          f"(n={out['n']})\naction: {out['action']}")
    return out


@task(retries=AF.retries, retry_delay=timedelta(seconds=AF.retry_delay_s),
      doc_md="The orgs with enough of the window's episodes (opt-out and forget applied): the cycle run's, gated, "
             "when its rtrl_episodes event triggered this run; a manual run harvests them first.")
def org_targets(w: dict) -> list[str]:
    from rl_core.harvest import harvest  # lazy: keeps DAG parsing light
    from rl_core.ledger import lineage_of
    from rl_core.orgs.branch import org_targets as targets

    cfg, run = load_config(), CycleRun.from_xcom(w)
    win = run.window
    if w.get("cycle_run"):  # rewriting the cycle's file would undo its `exclude` while the cycle still reads it
        print(f"episodes of realtime_rl run {w['cycle_run']}: harvested, gate_raw and gate_episodes passed")
    else:  # the ledger as realtime_rl's harvest consults it: the same file the cycle writes for this window
        harvest(cfg, win.start, win.end, run.policy, win.run_id, lineage=lineage_of(cfg, run.policy))
    orgs = targets(cfg, run.run_id, w.get("min_episodes"))
    print(f"orgs with enough episodes: {orgs}")
    return orgs


@task(pool=AF.training_pool, retries=0, map_index_template="{{ org }}",
      doc_md="One org end to end; raises on failure, which fails only this org's instance.")
def adapt_org(w: dict, org: str) -> dict:
    from rl_core.orgs.branch import adapt_org as run  # lazy: keeps DAG parsing light

    cycle = CycleRun.from_xcom(w)
    out = run(load_config(), cycle.window.start, cycle.window.end, cycle.policy, cycle.run_id, org,
              dry_run=cycle.dry_run)
    print(f"org {org}: {out}")
    return out


@task(trigger_rule="all_done", retries=0, doc_md="Each org's outcome, read back from its run folder and MLflow.")
def report(w: dict, orgs: list[str]) -> dict:
    from rl_core.orgs.pipeline import org_run_id  # lazy: keeps DAG parsing light
    from rl_core.orgs.registry import live_adapter

    cfg = load_config()
    lake = Lake(cfg.lake_root)
    out = {}
    for org in orgs:
        path = lake.run(org_run_id(CycleRun.from_xcom(w).run_id, org)).adapter
        adapter = lake.read_json(path) if lake.exists(path) else None
        live = live_adapter(cfg, org)
        out[org] = {"registered": adapter["adapter_version"] if adapter else None,
                    "live": live.adapter_version if live else None}
    print(f"org adapters of {w['run_id']}: {out}")
    return out


@dag(
    dag_id=f"{AF.dag_id}_orgs",
    schedule=EPISODES,  # each realtime_rl run whose episodes passed their gates; its window in the event
    start_date=SCHEDULE_ANCHOR,
    catchup=False,
    max_active_runs=1,
    default_args={"owner": "rtrl", "retries": 0},
    tags=["rtrl", "orgs"],
    doc_md=__doc__,
    params={
        "start": Param(None, type=["null", "string"], format="date-time", pattern=PARAM_TS_PATTERN,
                       maxLength=PARAM_TS_MAX_LEN, description=PARAM_TS_HELP.format("start")),
        "end": Param(None, type=["null", "string"], format="date-time", pattern=PARAM_TS_PATTERN,
                     maxLength=PARAM_TS_MAX_LEN, description=PARAM_TS_HELP.format("end")),
        "policy_version": Param(None, type=["null", "integer"], minimum=1, maximum=2**31 - 1,
                                description="base version (default: champion)"),
        "min_episodes": Param(None, type=["null", "integer"], minimum=1, description="default: gates.min_episodes"),
        "dry_run": Param(False, type="boolean", description="train and evaluate, register nothing, move no alias"),
    },
)
def realtime_rl_orgs():
    w = window()
    judged = org_ab.partial(w=w).expand(org=live_orgs())
    orgs = org_targets(w)
    done = adapt_org.partial(w=w).expand(org=orgs)
    [done, judged] >> report(w, orgs)


check_dag(realtime_rl_orgs(), ORG_CYCLE, "ORG_CYCLE")  # the tasks above are rl_core.stages.ORG_CYCLE's, in its order
