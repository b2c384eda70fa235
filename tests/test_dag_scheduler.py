"""The real scheduler: `airflow standalone` under setsid, a run triggered and a 2-window backfill created
through the REST API v2, all waited for to success, then the whole process group stopped.

Three full cycles through a real scheduler (LocalExecutor, one process per task): measured 11 min on the
loaded 2-core box (standalone start ~1-3 min, then ~3 min per run), well over the ~3 min of other slow
tests; it is the only test that exercises the scheduler, backfills and REST Param validation for real.
Issue 41 on the same server: the manual run is triggered as `rtrl cycle` triggers it (its window as its data
interval, its outcome as its note), the backfill dry run states what a backfill leaves out (the window still
open, the one the schedule took), and a backfill given a single-run param is refused run by run. And `rtrl
cycle`'s own path (lab.dagrun.scheduler_run) once, on a window without traffic: its task logs are where the UI
reads them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

# Windows on the schedule's grid (anchor 2026-01-01T00:00Z, every 5 h): 2026-12-01T00:00 is 8016 h = 1603.2
# periods after it, so the grid points that day are 04:00, 09:00, 14:00, 19:00.
BACKFILL_FROM = datetime(2026, 12, 1, 4, tzinfo=UTC)  # the grid windows inside [04:00, 14:00]: [04,09) [09,14)
BACKFILL_TO = datetime(2026, 12, 1, 14, tzinfo=UTC)
BACKFILL_STARTS = [BACKFILL_FROM, BACKFILL_FROM + timedelta(hours=5)]
TRIGGER_WINDOW = (datetime(2026, 12, 1, 14, tzinfo=UTC), datetime(2026, 12, 1, 19, tzinfo=UTC))


def _data(cfg, start: datetime, end: datetime, seed: int) -> None:
    from lab.testing.synth import ArmSpec, generate
    from rl_core.lake import Lake

    generate(24, start, end, seed=seed, lake=Lake(cfg.lake_root), orgs=tuple(cfg.simulate.orgs),
             arms=(ArmSpec(name="champion", model_version=1, share=1.0),), grace_hours=cfg.harvest.grace_hours)


def stalled(api, runs: list[dict], log) -> str:
    """Why nothing moved (the assertion message at the deadline): every run with its task states, including
    the scheduled run that unpausing creates (with max_active_runs=1 it holds the only slot while it runs),
    and the tail of the standalone log (a dead scheduler or executor shows there)."""
    lines = []
    for r in runs:
        tis = api.get(f"/dags/realtime_rl/dagRuns/{r['dag_run_id']}/taskInstances").json().get("task_instances", [])
        states = ", ".join(f"{ti['task_id']}={ti['state']}" for ti in tis)
        lines.append(f"{r['dag_run_id']} ({r['run_type']}) {r['state']}: {states}")
    return "\n".join(lines) + "\n--- standalone log ---\n" + log.read_text(errors="replace")[-4000:]


def failed_tasks(api, run_ids: list[str]) -> dict[str, str]:
    """task -> the tail of its log, for every failed task of the given runs (the assertion message)."""
    out = {}
    for run_id in run_ids:
        tis = api.get(f"/dags/realtime_rl/dagRuns/{run_id}/taskInstances").json()["task_instances"]
        for ti in tis:
            if ti["state"] == "failed":
                got = api.get(f"/dags/realtime_rl/dagRuns/{run_id}/taskInstances/{ti['task_id']}/logs/{ti['try_number']}")
                out[f"{run_id}/{ti['task_id']}"] = got.text[-3000:]
    return out


@dataclass
class Standalone:
    base: str  # the UI's URL
    api: Any  # an httpx client on /api/v2, signed in as admin
    password: str  # admin's (simple auth manager)
    log: Path


@contextmanager
def standalone(cfg, tmp_path: Path, **env: str) -> Iterator[Standalone]:
    """`airflow standalone` on a free port with quick retries and a 2-task eval, signed in over REST, once the
    dag-processor has parsed realtime_rl; its whole process group is stopped on exit."""
    import httpx

    from lab.cycle import start_airflow
    from rl_core.runtime.procs import free_port, stop

    port = free_port()
    log = tmp_path / "standalone.log"
    proc, password = start_airflow(cfg, port, log, AIRFLOW__CORE__UNIT_TEST_MODE="False", RTRL_EVAL__TASK_LIMIT="2",
                                   RTRL_AIRFLOW__RETRY_DELAY_S="1", **env)
    try:
        base = f"http://127.0.0.1:{port}"
        token = httpx.post(f"{base}/auth/token", json={"username": "admin", "password": password}).json()
        api = httpx.Client(base_url=f"{base}/api/v2", headers={"Authorization": f"Bearer {token['access_token']}"},
                           timeout=30)
        deadline = time.time() + 180
        while api.get("/dags/realtime_rl").status_code != 200:  # the dag-processor has not parsed it yet
            assert time.time() < deadline, log.read_text()[-3000:]
            time.sleep(2)
        yield Standalone(base, api, password, log)
    finally:
        stop(proc)


def create_backfill(api, body: dict, tries: int = 20):
    """POST /backfills, retried while SQLite is locked. A lock error is retried only when it left no backfill
    behind (Airflow removes a half-made one, best effort): a second backfill would be refused as a duplicate."""
    for _ in range(tries):
        bf = api.post("/backfills", json=body)
        # a 500 names its cause here: the test's api-server runs with [api] expose_stacktrace
        locked = bf.status_code == 503 or (bf.status_code == 500 and "database is locked" in bf.text)
        if not locked:
            return bf
        time.sleep(3)
        left = api.get("/backfills", params={"dag_id": body["dag_id"]})
        if left.status_code == 200:
            assert not left.json()["backfills"], ("a failed backfill left one behind", bf.text, left.text)
    return bf


def iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")  # how the REST API writes a UTC time


def backfill_says_what_it_does(api) -> None:
    """The REST check docs/production.md gives before a backfill (POST /backfills/dry_run, what the dialog counts):
    of a range from two windows before the latest ended one to past now, the window still open is left out, and so
    is the latest ended one, which unpausing gave the schedule (catchup off). A backfill given a single-run param
    then fails at `window`, saying why."""
    from rl_core.window import grid_floor

    latest, deadline = grid_floor(datetime.now(UTC), 5) - timedelta(hours=5), time.time() + 120
    while iso(latest) not in (held := {r["logical_date"] for r in api.get("/dags/realtime_rl/dagRuns").json()["dag_runs"]
                                       if r["run_type"] == "scheduled"}):
        assert time.time() < deadline, ("no scheduled run of the latest window", held)
        time.sleep(3)
    body = {"dag_id": "realtime_rl", "from_date": (latest - timedelta(hours=10)).isoformat(),
            "to_date": (latest + timedelta(hours=10)).isoformat()}  # past now: the open window ends after it
    dry = api.post("/backfills/dry_run", json=body)
    assert dry.status_code == 200, dry.text
    assert [b["logical_date"] for b in dry.json()["backfills"]] == [iso(latest - timedelta(hours=10)),
                                                                    iso(latest - timedelta(hours=5))]
    one = {"dag_id": "realtime_rl", "from_date": body["from_date"], "to_date": (latest - timedelta(hours=5)).isoformat(),
           "dag_run_conf": {"policy_version": 1}, "max_active_runs": 1}
    while (bf := create_backfill(api, one)).status_code == 409:  # the first backfill is not marked done yet
        assert time.time() < deadline + 120, bf.text
        time.sleep(5)
    assert bf.status_code == 200, bf.text
    deadline = time.time() + 300
    while not (bad := [r for r in api.get("/dags/realtime_rl/dagRuns").json()["dag_runs"] if r["run_type"] == "backfill"
                       and r["logical_date"] == iso(latest - timedelta(hours=10)) and r["state"] == "failed"]):
        assert time.time() < deadline, api.get("/dags/realtime_rl/dagRuns").json()
        time.sleep(3)
    got = api.get(f"/dags/realtime_rl/dagRuns/{bad[0]['dag_run_id']}/taskInstances/outcome/xcomEntries/return_value")
    assert "mean nothing for a backfill" in str(got.json()["value"]), got.text


@pytest.mark.slow
@pytest.mark.timeout(1500)  # a real scheduler running three full cycles: 5-11 min here, depending on load
def test_standalone_trigger_and_backfill_over_rest(registered, tmp_path):
    from lab.cycle import SCHEDULE_ANCHOR
    from lab.dagrun import outcome_of, trigger_window
    from rl_core.lake import Lake
    from rl_core.window import Window

    cfg = registered
    assert (BACKFILL_FROM - SCHEDULE_ANCHOR) % timedelta(hours=5) == timedelta(0)
    # seeds whose few synthetic users span both orgs: else gate_episodes (max_org_share) rightly refuses
    for seed, start in zip((3, 10, 11), [*BACKFILL_STARTS, TRIGGER_WINDOW[0]], strict=True):
        _data(cfg, start, start + timedelta(hours=5), seed=seed)
    with standalone(cfg, tmp_path, AIRFLOW__API__EXPOSE_STACKTRACE="True") as af:
        api, log = af.api, af.log
        # the backfill first, while the DAG is paused: on SQLite, Airflow answers a backfill that meets the
        # scheduler's writes with "database is locked" (503, or 500 when the lock hits outside the route's
        # handler; CI saw both), and a paused DAG gives the scheduler nothing to write. Its runs start on unpause.
        body = {"dag_id": "realtime_rl", "from_date": BACKFILL_FROM.isoformat(), "to_date": BACKFILL_TO.isoformat(),
                "max_active_runs": 1, "dag_run_conf": {"dry_run": True}}
        bf = create_backfill(api, body)
        assert bf.status_code == 200, bf.text
        assert api.patch("/dags/realtime_rl", json={"is_paused": False}).status_code == 200
        bad = api.post("/dags/realtime_rl/dagRuns", json={"logical_date": None, "conf": {"policy_version": 0}})
        assert bad.status_code == 400, bad.text  # Params are validated at trigger time
        run = trigger_window(api, "realtime_rl", Window(*TRIGGER_WINDOW, "cycle-20261201T1900"), {})  # as `rtrl cycle`
        assert (run["data_interval_start"], run["data_interval_end"]) == tuple(iso(t) for t in TRIGGER_WINDOW), run
        deadline = time.time() + 1200
        while True:
            runs = api.get("/dags/realtime_rl/dagRuns").json()["dag_runs"]
            # unpausing also schedules the latest interval (catchup is off): its window has no data, so it
            # ends skipped; only the manual and backfill runs must succeed
            ours = {r["dag_run_id"]: r["state"] for r in runs if r["run_type"] in ("manual", "backfill")}
            failed = [r for r, s in ours.items() if s == "failed"]
            assert not failed, (ours, failed_tasks(api, failed))
            if len(ours) == 3 and set(ours.values()) == {"success"}:
                break
            assert time.time() < deadline, stalled(api, runs, log)
            time.sleep(5)
        intervals = sorted(r["data_interval_start"] for r in runs if r["run_type"] == "backfill")
        assert [datetime.fromisoformat(s.replace("Z", "+00:00")) for s in intervals] == BACKFILL_STARTS
        line = outcome_of(api, "realtime_rl", run["dag_run_id"])
        assert line.startswith("registered v2 -> challenger"), line
        # the scheduler's listener made the outcome every run's note, the backfill's as the manual run's
        notes = {r["dag_run_id"]: r["note"] for r in api.get("/dags/realtime_rl/dagRuns").json()["dag_runs"]}
        assert notes[run["dag_run_id"]] == line, notes
        assert all(notes[r] for r in ours), notes
        backfill_says_what_it_does(api)
    lake = Lake(cfg.lake_root)
    for run_id in ("cycle-20261201T0900", "cycle-20261201T1400", "cycle-20261201T1900"):
        assert lake.exists(f"runs/{run_id}/episodes.parquet"), run_id
    from rl_core.registry import store

    aliases = store.aliases(cfg)
    assert aliases["champion"] == 1 and aliases.get("challenger") == 2  # dry-run backfills registered nothing


@pytest.mark.slow
@pytest.mark.timeout(900)  # standalone start 1-3 min here, then a run up to `harvest` (~1-2 min)
def test_a_cycle_runs_through_the_scheduler_with_its_logs_where_the_ui_reads_them(registered, tmp_path, monkeypatch):
    """`rtrl cycle`'s DAG run (lab.dagrun.scheduler_run) on a window without traffic: a manual run whose data
    interval is the window, its outcome as its note, its task logs under $AIRFLOW_HOME/logs (where the UI reads
    them); the scheduler made no run of its own and the DAG is paused again as it was."""
    from lab.dagrun import scheduler_run
    from rl_core.config import load_config
    from rl_core.runtime.procs import free_port
    from rl_core.window import Window

    for k, v in {"RTRL_AIRFLOW__UI_PORT": str(free_port()), "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
                 "RTRL_AIRFLOW__RETRY_DELAY_S": "1"}.items():
        monkeypatch.setenv(k, v)
    cfg = load_config()
    s, e = datetime(2026, 12, 3, 1, 7, tzinfo=UTC), datetime(2026, 12, 3, 1, 20, tzinfo=UTC)
    rc, run_id, line = scheduler_run(cfg, Window(s, e, "cycle-20261203T0107-20261203T0120"), tmp_path / "af.log",
                                     "realtime_rl", {})
    assert rc == 0 and line.startswith("skipped: no traffic in [2026-12-03T01:07:00+00:00"), (line, run_id)
    logs = cfg.airflow_home / "logs" / "dag_id=realtime_rl" / f"run_id={run_id}"
    window_log = "".join(p.read_text() for p in (logs / "task_id=window").glob("attempt=*.log"))
    assert "rtrl run cycle-20261203T0107-20261203T0120: window [2026-12-03T01:07:00+00:00" in window_log, sorted(
        p.name for p in logs.iterdir())
    assert line in "".join(p.read_text() for p in (logs / "task_id=outcome").glob("attempt=*.log"))
    # read back as the UI would, on a fresh server: the run, its data interval and note; nothing else ran
    with standalone(cfg, tmp_path) as af:
        dr = af.api.get(f"/dags/realtime_rl/dagRuns/{run_id}").json()
        assert (dr["data_interval_start"], dr["data_interval_end"], dr["note"]) == (iso(s), iso(e), line), dr
        assert [r["dag_run_id"] for r in af.api.get("/dags/realtime_rl/dagRuns").json()["dag_runs"]] == [run_id]
        assert af.api.get("/dags/realtime_rl").json()["is_paused"] is True
        got = af.api.get(f"/dags/realtime_rl/dagRuns/{run_id}/taskInstances/window/logs/1")  # the UI's log view
        assert got.status_code == 200 and "rtrl run cycle-20261203T0107-20261203T0120" in got.text, got.text[-2000:]
