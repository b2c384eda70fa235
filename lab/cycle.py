"""`rtrl cycle` / `make cycle`: one real cycle on the embedded stack, plus the glue the DAG shares.

The window helpers (`resolve_window`, `run_id_for`, the grid's anchor) live in rl_core/window.py and are
re-exported here for the callers that import them from this module. `run_cycle` is what `make cycle` runs:
`rtrl init` if needed, the serving gateway as a subprocess, simulated users driving it over HTTP,
compaction into the lake, a DAG run of realtime_rl whose data interval is exactly the window the traffic fell
in, then a summary read back from the lake and MLflow. Everything it starts it stops (process groups).

The DAG run goes through the scheduler (lab/dagrun.py: the embedded Airflow of lab/airflow.py, the run triggered over REST), so
its task logs are under $AIRFLOW_HOME/logs where the UI reads them, like any run's, and its outcome line becomes the
run's note. `rtrl experiment` (a gateway and a warm server that outlive its cycles) runs each cycle's DAG in one
process instead (`dag.test()` with the same data interval), its output in dags-test.log.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from lab.airflow import airflow_env, bin_path, prepare_airflow, start_airflow  # noqa: F401  re-exported
from rl_core.config import Config, load_config
from rl_core.runtime.procs import exit_on_sigterm, serve_until_interrupted, start, stop, wait_http  # noqa: F401
from rl_core.window import (  # noqa: F401  re-exported: the window helpers moved to rl_core/window.py
    SCHEDULE_ANCHOR,
    Window,
    latest_window_end,
    resolve_window,
    run_id_for,
)

# --- processes: the embedded Airflow's (lab/airflow.py), each in its own session ---------------------

def start_mlflow(cfg: Config, port: int, log: Path) -> subprocess.Popen:
    """The embedded MLflow UI as `make mlflow` starts it (one worker, no job queue: lab/stack/mlflow_ui.py)."""
    from lab.stack.mlflow_ui import start_ui

    return start_ui(cfg, port, log)


# --- `rtrl cycle`: the whole thing once, on the embedded stack ------------------------------------------

@dataclass
class CycleReport:
    run_id: str
    start: str
    end: str
    dag_rc: int
    interactions: int = 0
    episodes: int = 0
    mean_reward: float | None = None
    verdicts: dict[str, bool] | None = None
    eval: dict[str, Any] | None = None
    version: int | None = None
    aliases: dict[str, int] | None = None
    seconds: dict[str, float] | None = None
    airflow_run_id: str | None = None  # the scheduler path's DAG run (its logs and note in the UI)
    outcome: str | None = None  # the run's one-line outcome (the `outcome` task's return value)


def _minute(ts: datetime, up: bool) -> datetime:
    floor = ts.replace(second=0, microsecond=0)
    return floor + timedelta(minutes=1) if up and floor != ts else floor


def drive_traffic(cfg: Config, base_url: str, interactions: int | None) -> int:
    """Simulated users through the real HTTP API (lab.simulate); returns the interactions made."""
    from lab.simulate.runner import SimSpec, simulate  # lazy: keeps rtrl --help fast (pyarrow)

    report = simulate(cfg, base_url, SimSpec.from_config(cfg, interactions=interactions), progress=False)
    print(report.table())
    if report.interactions == 0:
        raise RuntimeError(f"the simulator made no interaction: {report.error_examples[:3]}")
    return report.interactions


def summarize(cfg: Config, w: Window, dag_rc: int) -> CycleReport:
    """What the cycle left behind, read back from the lake and MLflow (not from the DAG's logs)."""
    import pyarrow.compute as pc  # lazy: keeps rtrl --help fast (pyarrow)

    from rl_core.lake import Lake
    from rl_core.registry import store
    from rl_core.reports import read_verdicts

    lake = Lake(cfg.lake_root)
    r = CycleReport(run_id=w.run_id, start=w.start.isoformat(), end=w.end.isoformat(), dag_rc=dag_rc)
    run = lake.run(w.run_id)
    if lake.exists(run.episodes):
        r.episodes = lake.read_parquet(run.episodes).num_rows
    if lake.exists(run.rewards):
        rewards = lake.read_parquet(run.rewards)
        r.mean_reward = float(pc.mean(rewards["reward"]).as_py()) if rewards.num_rows else None
    verdicts = read_verdicts(lake, w.run_id)
    r.verdicts = {k: v.passed for k, v in verdicts.items()}
    if lake.exists(f"{run.eval}/comparison.json"):
        cmp = lake.read_json(f"{run.eval}/comparison.json")
        r.eval = {"verdict": cmp.get("verdict"),
                  **{f"delta_{m['metric']}": round(m["mean_diff"], 4) for m in cmp.get("metrics", [])}}
    try:
        from rl_core.registry.register import find_version  # lazy: keeps rtrl --help fast (pyarrow)

        r.version = find_version(cfg, w.run_id)
    except ImportError:
        r.version = None
    r.aliases = store.aliases(cfg)
    return r


def print_report(cfg: Config, r: CycleReport) -> None:
    alias = [a for a, v in (r.aliases or {}).items() if v == r.version]
    reward = "n/a" if r.mean_reward is None else f"{r.mean_reward:+.4f}"
    lines = [
        "", f"== rtrl cycle {r.run_id}  ({r.start} .. {r.end})",
        f"DAG run              {'success' if r.dag_rc == 0 else f'FAILED (exit {r.dag_rc})'}"
        + (f" {r.airflow_run_id}" if r.airflow_run_id else ""), f"outcome              {r.outcome or 'n/a'}",
        f"interactions served  {r.interactions}", f"episodes harvested   {r.episodes}",
        f"mean reward          {reward}",
        "verdicts             " + (", ".join(f"{k}={'pass' if ok else 'FAIL'}" for k, ok in (r.verdicts or {}).items())
                                   or "none"),
        f"eval                 {json.dumps(r.eval) if r.eval else 'n/a'}",
        f"new version          {r.version if r.version is not None else 'none registered'}"
        + (f" (alias {', '.join(alias)})" if alias else ""),
        f"aliases now          {r.aliases}",
        f"timings (s)          {json.dumps(r.seconds)}",
        f"lake                 {cfg.lake_root}/runs/{r.run_id}/",
        f"MLflow UI            `make mlflow` -> http://127.0.0.1:{cfg.mlflow.ui_port}/#/models/{cfg.mlflow.model_name}",
        f"Airflow UI           `make airflow` -> http://127.0.0.1:{cfg.airflow.ui_port}/dags/{cfg.airflow.dag_id}"
        + (f"/runs/{r.airflow_run_id} (the run, its task logs and note)" if r.airflow_run_id else ""),
    ]
    print("\n".join(lines))


def wait_for_window(cfg: Config) -> float:
    """Sleep until the previous cycle's window has ended, so that consecutive windows never overlap (each turn
    is harvested, A/B-tested and monitored by one cycle). Returns the seconds waited."""
    p = cfg.home_path / "cycle-window-end"
    end = datetime.fromisoformat(p.read_text().strip()) if p.exists() else datetime.now(UTC)
    wait = max((end - datetime.now(UTC)).total_seconds(), 0.0)
    time.sleep(wait)
    return wait


def run_cycle(cfg: Config, interactions: int | None = None, log_dir: Path | None = None,
              policy_version: int | None = None, gateway_url: str | None = None,
              warm_socket: str | None = None, run_dag: bool = True, dag_id: str | None = None,
              via_scheduler: bool | None = None) -> CycleReport:
    """init -> gateway -> simulated traffic -> compaction -> a DAG run on the window -> report; stops what it starts.
    via_scheduler: run the DAG through the embedded Airflow (scheduler_run); default: unless gateway_url or
    warm_socket is given (`rtrl experiment`), whose cycles run it in one process (dags_test).
    policy_version: the version the DAG updates (its `policy_version` param); None = the champion.
    gateway_url: a gateway that outlives the cycle (`rtrl experiment`, rl_core/serving/gateway.py): instead
    of starting one, wait until it serves the registry's aliases; instead of stopping it, wait for its WAL.
    warm_socket: a warm server (lab/warm.py) that forks the DAG run (`python -m lab.dagrun`) and the
    trainer.
    run_dag=False: traffic only (an experiment's last cycle measures the policy; nothing trains after it).
    dag_id: the DAG to run on the window (default the cycle's; `<dag_id>_orgs` trains the org adapters)."""
    from lab.dagrun import check_ui_port, dags_test, scheduler_run  # lazy: heavy (httpx)
    from rl_core.collect.compact import compact  # lazy: keeps rtrl --help fast (pyarrow)
    from rl_core.init import init
    from rl_core.lake import Lake
    from rl_core.serving import gateway as gw

    log_dir = log_dir or cfg.home_path / "logs" / "cycle"
    log_dir.mkdir(parents=True, exist_ok=True)
    scheduler = run_dag and (via_scheduler if via_scheduler is not None else not (gateway_url or warm_socket))
    if scheduler:
        check_ui_port(cfg)  # before the traffic: its DAG run would find the port taken
    secs: dict[str, float] = {}
    t = time.time()
    ini = init(cfg, check_generation=False)
    print(f"[cycle] champion = version {ini.version} ({'registered now' if ini.created else 'already there'})")
    env = airflow_env(cfg)
    prepare_airflow(cfg, env)
    secs["init"] = round(time.time() - t, 1)

    t = time.time()
    proc = None
    if gateway_url:
        base_url = gateway_url
        serving = gw.wait_in_sync(cfg, base_url, cfg.serving.vllm_startup_timeout_s + 120)
        print(f"[cycle] gateway {base_url} serves {serving}")
        secs["gateway_sync"] = round(time.time() - t, 1)
    else:
        print(f"[cycle] starting gateway (log {log_dir / 'gateway.log'})")
        # a gateway for one cycle only: a spare engine started beside it would only compete with the traffic
        proc, base_url = gw.start_gateway(cfg, env | {"RTRL_SERVING__PREWARM_SPARE": "false"},
                                          log_dir / "gateway.log")
        secs["gateway_start"] = round(time.time() - t, 1)
    try:
        secs["wait_window"] = round(wait_for_window(cfg), 1)
        t = time.time()
        begin = datetime.now(UTC)
        n = drive_traffic(cfg, f"{base_url}/v1", interactions)
        finish = datetime.now(UTC)
        secs["traffic"] = round(time.time() - t, 1)
    finally:
        stop(proc)  # closing the gateway seals and compacts its WAL
    t = time.time()
    if gateway_url:
        gw.wait_wal_sealed(cfg.wal_dir, cfg.serving.segment_max_age_s + 30)
    c = compact(cfg.wal_dir, Lake(cfg.lake_root))
    print(f"[cycle] compacted {c.segments} WAL segments into {cfg.lake_root}")
    start_ts, end_ts = _minute(begin, up=False), _minute(finish, up=True) + timedelta(minutes=1)
    (cfg.home_path / "cycle-window-end").write_text(end_ts.isoformat())
    w = Window(start_ts, end_ts, run_id_for(start_ts, end_ts, cfg.airflow.schedule_hours))
    rc, af_run, line = 0, None, None
    if run_dag:
        dag, conf = dag_id or cfg.airflow.dag_id, {"policy_version": int(policy_version)} if policy_version else {}
        if scheduler:
            rc, af_run, line = scheduler_run(cfg, w, log_dir / "airflow.log", dag, conf)
        else:
            rc = dags_test(env, w, log_dir / "dags-test.log", dag, conf, warm_socket)
        secs["dag"] = round(time.time() - t, 1)
    report = summarize(cfg, w, rc)
    report.interactions, report.seconds, report.airflow_run_id, report.outcome = n, secs, af_run, line
    return report


def add_cycle(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interactions", type=int, default=None, help="simulated interactions (default: [simulate])")
    p.add_argument("--ui", choices=["airflow", "mlflow"], default=None,
                   help="instead of a cycle: start that UI on the embedded stores until Ctrl-C")
    p.set_defaults(run=_run)


def _run(args) -> int:
    cfg = load_config()
    if args.ui == "airflow":
        log = cfg.home_path / "logs" / "airflow.log"
        proc, password = start_airflow(cfg, cfg.airflow.ui_port, log)
        print(f"Airflow UI  http://127.0.0.1:{cfg.airflow.ui_port}   user admin   password {password}")
        print(f"AIRFLOW_HOME {cfg.airflow_home}   log {log}   (Ctrl-C stops the whole process group)")
        return serve_until_interrupted([proc])
    if args.ui == "mlflow":
        log = cfg.home_path / "logs" / "mlflow-ui.log"
        proc = start_mlflow(cfg, cfg.mlflow.ui_port, log)
        print(f"MLflow UI   http://127.0.0.1:{cfg.mlflow.ui_port}   (no login)   store {cfg.tracking_uri}")
        print(f"model       http://127.0.0.1:{cfg.mlflow.ui_port}/#/models/{cfg.mlflow.model_name}   (Ctrl-C stops it)")
        return serve_until_interrupted([proc])
    t0 = time.time()
    with exit_on_sigterm():  # unwind: the finally blocks stop the gateway
        report = run_cycle(cfg, args.interactions)
    print_report(cfg, report)
    print(f"cycle done in {time.time() - t0:.0f}s")
    return report.dag_rc
