"""A cycle's DAG run on exactly its window: through the scheduler (`rtrl cycle`), or in one process (`rtrl experiment`).

Every run's data interval is its harvest window (rl_core/window.py). `rtrl cycle`'s window is the minutes its
traffic fell in, not a grid window, so its run is triggered the way the trigger form's Data Interval "Specify
Manually" does it (REST data_interval_start/_end), on the embedded Airflow (lab/airflow.py) whose scheduler makes no run of its own:
the run's task logs land under $AIRFLOW_HOME/logs, where the UI (`make airflow`) reads them, and its one-line outcome
is its note, as for every run (the plugin's listener, plugins/rtrl_operators/outcome_note.py). `rtrl experiment`'s cycles run the DAG in one process
(dag.test(), forkable from the warm server), the timetable told the window (GridTimetable.manual_window), since
`airflow dags test` can only infer a grid window from a logical date.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lab.airflow import start_airflow
from rl_core.config import REPO_ROOT, Config
from rl_core.runtime.procs import stop
from rl_core.window import Window, run_id_for


def rest_client(base: str, password: str):
    """An httpx client on base's /api/v2, signed in as admin (simple auth manager)."""
    import httpx  # lazy: keeps rtrl --help fast

    token = httpx.post(f"{base}/auth/token", json={"username": "admin", "password": password}, timeout=30)
    token.raise_for_status()
    return httpx.Client(base_url=f"{base}/api/v2", timeout=30,
                        headers={"Authorization": f"Bearer {token.json()['access_token']}"})


def trigger_window(api, dag_id: str, w: Window, conf: dict[str, Any]) -> dict[str, Any]:
    """A manual run of dag_id whose data interval is w, over REST (what the trigger form's Data Interval "Specify
    Manually" sends). Airflow keeps a data interval only beside a logical date: the trigger time, as in the form
    (a window's start could be a grid point, whose logical date belongs to the schedule's run of that window)."""
    body = {"logical_date": datetime.now(UTC).isoformat(), "data_interval_start": w.start.isoformat(),
            "data_interval_end": w.end.isoformat(), "conf": conf}
    r = api.post(f"/dags/{dag_id}/dagRuns", json=body)
    if r.status_code != 200:
        raise RuntimeError(f"triggering {dag_id} on {w.run_id} failed: HTTP {r.status_code} {r.text[:1000]}")
    return r.json()


def outcome_of(api, dag_id: str, run_id: str) -> str | None:
    """The `outcome` task's line (its return value, also the run's note); None when the run has none."""
    r = api.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/outcome/xcomEntries/return_value")
    line = r.json().get("value") if r.status_code == 200 else None
    if isinstance(line, str) and line.startswith('"'):  # the raw value, when a store keeps it JSON-encoded
        line = json.loads(line)
    return str(line) if line else None


def _run_state(api, path: str) -> str | None:
    import httpx  # lazy: keeps rtrl --help fast

    try:
        r = api.get(path)
    except httpx.TransportError:  # a busy api-server (SQLite): asked again
        return None
    return r.json().get("state") if r.status_code == 200 else None


def check_ui_port(cfg: Config) -> str:
    """[airflow] ui_port's URL, or RuntimeError when something answers there already (`make airflow` on the same
    metadata DB: two schedulers must not share one SQLite DB). `rtrl cycle` asks before it drives any traffic."""
    import socket

    base = f"http://127.0.0.1:{cfg.airflow.ui_port}"
    with socket.socket() as sock:
        if sock.connect_ex(("127.0.0.1", cfg.airflow.ui_port)) == 0:
            raise RuntimeError(f"something already listens on {base} (`make airflow`?): stop it first; two "
                               "schedulers must not share one SQLite metadata DB")
    return base


def scheduler_run(cfg: Config, w: Window, log: Path, dag_id: str, conf: dict[str, Any]) -> tuple[int, str, str | None]:
    """`rtrl cycle`'s DAG run, like any other: the embedded Airflow on [airflow] ui_port, its scheduler making no
    run of its own (use_job_schedule off); the run triggered with w as its data interval (trigger_window), waited
    for (its outcome line is its note); the DAG's pause state restored, Airflow stopped. Its task logs stay under
    $AIRFLOW_HOME/logs, where `make airflow` shows them. Returns (0 if it succeeded else 1, run id, outcome)."""
    base = check_ui_port(cfg)
    print(f"[cycle] airflow on {base} (log {log})")
    proc, password = start_airflow(cfg, cfg.airflow.ui_port, log, AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE="False")
    try:
        api, deadline = rest_client(base, password), time.time() + 300
        while api.get(f"/dags/{dag_id}").status_code != 200:  # the dag-processor has not parsed it yet
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError(f"Airflow did not load DAG {dag_id} (log {log})")
            time.sleep(2)
        paused = api.get(f"/dags/{dag_id}").json()["is_paused"]
        api.patch(f"/dags/{dag_id}", json={"is_paused": False})  # a paused DAG's runs wait: none of its own here
        try:
            run_id = trigger_window(api, dag_id, w, conf)["dag_run_id"]
            print(f"[cycle] DAG run {run_id}: {base}/dags/{dag_id}/runs/{run_id} (admin / {password}) while it runs")
            while (state := _run_state(api, f"/dags/{dag_id}/dagRuns/{run_id}")) not in ("success", "failed"):
                if proc.poll() is not None:
                    raise RuntimeError(f"airflow exited ({proc.returncode}) during {run_id} (log {log})")
                time.sleep(3)
            line = outcome_of(api, dag_id, run_id)
        finally:
            api.patch(f"/dags/{dag_id}", json={"is_paused": paused})
    finally:
        stop(proc)
    print(f"[cycle] {run_id} {state}: {line}\n[cycle] its task logs: `make airflow` -> {base}/dags/{dag_id}/runs/"
          f"{run_id}; files under {cfg.airflow_home}/logs/dag_id={dag_id}/run_id={run_id}/")
    return (0 if state == "success" else 1), run_id, line


def dag_test(dag_id: str, w: Window, conf: dict[str, Any]) -> str:
    """One `dag.test()` of dag_id in this process on window w; the run's state. On the grid (realtime_rl) w is its
    data interval (GridTimetable.manual_window: `airflow dags test` can only infer a grid window from a logical
    date); a DAG scheduled on an Asset (realtime_rl_orgs, on rtrl_episodes) gets w as its start/end params, its
    manual path, since no realtime_rl run's event triggers this run."""
    from airflow.dag_processing.dagbag import DagBag  # lazy: keeps rtrl --help fast

    dag = DagBag(dag_folder=str(REPO_ROOT / "dags")).dags[dag_id]
    if hasattr(dag.timetable, "manual_window"):
        dag.timetable.manual_window = (w.start, w.end)
    else:
        conf = {"start": w.start.isoformat(), "end": w.end.isoformat(), **conf}
    return str(dag.test(run_conf=conf).state)


def dags_test(env: dict[str, str], w: Window, dag_log: Path, dag_id: str, conf: dict[str, Any],
              warm_socket: str | None) -> int:
    """dag_test of dag_id on window w in a child process (`python -m lab.dagrun`, forked from the warm server
    when there is one), output appended to dag_log; its exit code."""
    argv = [sys.executable, "-m", "lab.dagrun", dag_id, w.start.isoformat(), w.end.isoformat(), json.dumps(conf)]
    print(f"[cycle] dag.test() of {dag_id} on [{w.start.isoformat()}, {w.end.isoformat()}) (log {dag_log})")
    with open(dag_log, "ab") as out:
        if warm_socket:  # the DAG (and the trainer it launches) forked from a warm server: no import costs
            from lab import warm  # lazy: dev-only warm server, kept out of the DAG's imports

            return warm.popen(argv, env | {warm.SOCKET_ENV: warm_socket}, REPO_ROOT, stdout=out,
                              stderr=subprocess.STDOUT).wait()
        return subprocess.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT).returncode


if __name__ == "__main__":  # dags_test's child: python -m lab.dagrun DAG_ID START END CONF_JSON
    _dag, _start, _end, _conf = sys.argv[1:5]
    _s, _e = datetime.fromisoformat(_start), datetime.fromisoformat(_end)
    sys.exit(0 if dag_test(_dag, Window(_s, _e, run_id_for(_s, _e, 1)), json.loads(_conf)) == "success" else 1)
