"""The production stack, really run (`rtrl stack`): PostgreSQL, Redis, an S3 endpoint, the MLflow server and
Airflow's CeleryExecutor with two workers, on free ports under a temporary folder.

One cycle in production mode: the gateway serves and logs to its write-ahead log, the log is compacted into the
S3 lake, the DAG runs on the Celery workers against PostgreSQL, harvest and rewards read S3 through DuckDB, the
checkpoint is registered in the MLflow server with its artifacts in S3, the aliases move and the gateway swaps.
Mid-cycle, the worker that runs `train` dies (kill -9 of it and everything it started, as when its machine goes):
Airflow notices the missing heartbeat, retries the task on the other worker, and the version is registered once.
Then a backfill of three windows is created while a scheduled run is active (the case SQLite refuses).

Skipped where Debian's postgresql and redis-server are not installed (`make sysdeps` installs them; CI does)."""

from __future__ import annotations

import glob
import os
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lab.stack.cli import down, running, status, up
from lab.stack.parts import LAKE_BUCKET, MLFLOW_BUCKET, PARTS, Ports, Stack
from rl_core.runtime.procs import environ

HAVE = bool(glob.glob("/usr/lib/postgresql/*/bin/postgres") or shutil.which("postgres")) and bool(
    shutil.which("redis-server"))
pytestmark = [pytest.mark.stack, pytest.mark.slow,
              pytest.mark.skipif(not HAVE, reason="needs Debian's postgresql and redis-server (make sysdeps)")]

DAG = "realtime_rl"
# Airflow's own settings for the test: a task whose worker died is noticed after 30 s (default 300), and the
# retries come at once; a 2-task eval keeps the cycle short
TEST_ENV = {"AIRFLOW__CORE__UNIT_TEST_MODE": "False", "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
            "AIRFLOW__API__EXPOSE_STACKTRACE": "True", "RTRL_EVAL__TASK_LIMIT": "2", "RTRL_AIRFLOW__RETRY_DELAY_S": "1"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("stack"), Ports.free())
    with environ({**TEST_ENV, **s.env()}):  # this process too reads the lake on S3 and the MLflow server
        try:
            up(s)
            yield s
        finally:
            down(s, purge=True)
    assert not left_behind(s), "rtrl stack down left processes behind"


def left_behind(s: Stack) -> list[str]:
    """Live processes that belong to the stack: its folder in their command line or environment."""
    mark = str(s.root).encode()
    found = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int(d.name) != os.getpid() and "\nState:\tZ" not in (d / "status").read_text() \
                    and (mark in (d / "cmdline").read_bytes() or mark in (d / "environ").read_bytes()):
                found.append((d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass
    return found


@pytest.fixture(scope="module")
def api(stack):
    return stack.airflow_api(wait_for=DAG, wait_s=180)


def stack_cfg(s: Stack):
    from rl_core.config import load_config

    return load_config()


def s3(s: Stack):
    import boto3

    return boto3.client("s3", endpoint_url=s.s3_url, aws_access_key_id="rtrl-stack",
                        aws_secret_access_key="rtrl-stack", region_name="us-east-1")


def keys(s: Stack, bucket: str, prefix: str) -> list[str]:
    pages = s3(s).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def task_states(api, run_id: str) -> dict[str, tuple[str, int]]:
    tis = api.get(f"/dags/{DAG}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
    return {ti["task_id"]: (ti["state"], ti["try_number"]) for ti in tis}


def wait_run(api, run_id: str, deadline_s: float, log_hint=None) -> str:
    deadline = time.time() + deadline_s
    while True:
        state = api.get(f"/dags/{DAG}/dagRuns/{run_id}").json()["state"]
        if state in ("success", "failed"):
            return state
        assert time.time() < deadline, (run_id, task_states(api, run_id), log_hint() if log_hint else "")
        time.sleep(3)


def kill_machine_of(s: Stack, marker: str) -> str:
    """kill -9 the Celery worker whose process tree runs a command line containing marker, with every process
    it started (the trainer sits in its own session: a machine that dies takes it too). Returns the worker."""
    import psutil

    def cmdline(p) -> str:
        try:
            return " ".join(p.cmdline())
        except psutil.Error:
            return ""

    for part in PARTS:
        if not part.name.startswith("airflow-worker"):
            continue
        root = psutil.Process(running(s, part))
        tree = [root, *root.children(recursive=True)]
        if any(marker in cmdline(p) for p in tree):
            for p in tree:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            return part.name
    raise AssertionError(f"no worker runs {marker!r}")


def test_up_is_idempotent_and_every_part_is_healthy(stack, capsys):
    up(stack)
    said = capsys.readouterr().out
    assert said.count("already up") == len(PARTS), said
    assert status(stack)
    assert LAKE_BUCKET in {b["Name"] for b in s3(stack).list_buckets()["Buckets"]}


def serve_and_drive(cfg, log_dir):
    """The gateway (`rtrl serve`) and simulated users over HTTP; its write-ahead log compacted into the S3
    lake; returns the gateway, its URL and the window the traffic fell in."""
    from lab.cycle import drive_traffic
    from rl_core.collect.compact import compact
    from rl_core.lake import Lake
    from rl_core.serving import gateway as gw
    from rl_core.window import Window, run_id_for

    proc, url = gw.start_gateway(cfg, dict(os.environ), log_dir / "gateway.log")
    begin = datetime.now(UTC).replace(second=0, microsecond=0)
    drive_traffic(cfg, f"{url}/v1", None)
    end = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(minutes=2)
    gw.wait_wal_sealed(cfg.wal_dir, cfg.serving.segment_max_age_s + 30)
    compact(cfg.wal_dir, Lake(cfg.lake_root))
    return proc, url, Window(begin, end, run_id_for(begin, end, cfg.airflow.schedule_hours))


@pytest.fixture(scope="module")
def scheduled(stack, api) -> dict:
    """Unpause the DAG: the scheduler starts the run of the latest whole interval, which gets traffic first
    so that its run is a whole cycle (minutes), still busy when the backfill is created. Returns that run."""
    from rl_core.window import SCHEDULE_ANCHOR

    cfg = stack_cfg(stack)
    period = timedelta(hours=cfg.airflow.schedule_hours)
    latest = SCHEDULE_ANCHOR + ((datetime.now(UTC) - SCHEDULE_ANCHOR) // period - 1) * period
    synth(cfg, latest, seed=12)
    assert api.patch(f"/dags/{DAG}", json={"is_paused": False}).status_code == 200
    deadline = time.time() + 120
    while not (runs := [r for r in api.get(f"/dags/{DAG}/dagRuns").json()["dag_runs"] if r["run_type"] == "scheduled"]):
        assert time.time() < deadline, "unpausing scheduled no run"
        time.sleep(1)
    assert runs[0]["data_interval_start"].startswith(latest.strftime("%Y-%m-%dT%H")), runs
    return runs[0]


def synth(cfg, start: datetime, seed: int) -> None:
    from lab.testing.synth import ArmSpec, generate
    from rl_core.lake import Lake

    generate(24, start, start + timedelta(hours=cfg.airflow.schedule_hours), seed=seed, lake=Lake(cfg.lake_root),
             orgs=tuple(cfg.simulate.orgs), arms=(ArmSpec(name="champion", model_version=1, share=1.0),),
             grace_hours=cfg.harvest.grace_hours)


@pytest.mark.timeout(1500)
def test_backfill_created_while_a_scheduled_run_is_active(stack, api, scheduled):
    from rl_core.window import SCHEDULE_ANCHOR

    cfg = stack_cfg(stack)
    period = timedelta(hours=cfg.airflow.schedule_hours)
    first = SCHEDULE_ANCHOR + ((datetime(2026, 11, 20, tzinfo=UTC) - SCHEDULE_ANCHOR) // period) * period
    starts = [first + i * period for i in range(3)]
    for seed, start in zip((3, 10, 11), starts, strict=True):
        synth(cfg, start, seed)
    assert api.get(f"/dags/{DAG}/dagRuns/{scheduled['dag_run_id']}").json()["state"] in ("queued", "running")
    bf = api.post("/backfills", json={"dag_id": DAG, "from_date": starts[0].isoformat(),
                                      "to_date": (starts[-1] + period).isoformat(),  # the windows inside [from, to]
                                      "max_active_runs": 1,  # harvested by hour: mapped tasks on both workers
                                      "dag_run_conf": {"dry_run": True, "map_hours": 1}})
    assert bf.status_code == 200, bf.text  # on PostgreSQL, no "database is locked"
    assert api.get(f"/dags/{DAG}/dagRuns/{scheduled['dag_run_id']}").json()["state"] in ("queued", "running")
    deadline = time.time() + 1200
    while True:
        runs = [r for r in api.get(f"/dags/{DAG}/dagRuns").json()["dag_runs"]
                if r["run_type"] == "backfill" or r["dag_run_id"] == scheduled["dag_run_id"]]
        assert not [r for r in runs if r["state"] == "failed"], {r["dag_run_id"]: task_states(api, r["dag_run_id"])
                                                                  for r in runs if r["state"] == "failed"}
        if len(runs) == 4 and all(r["state"] == "success" for r in runs):
            break
        assert time.time() < deadline, [(r["dag_run_id"], r["state"]) for r in runs]
        time.sleep(5)
    backfilled = [r for r in runs if r["run_type"] == "backfill"]
    assert sorted(datetime.fromisoformat(r["data_interval_start"].replace("Z", "+00:00")) for r in backfilled) == starts
    tis = api.get(f"/dags/{DAG}/dagRuns/{backfilled[0]['dag_run_id']}/taskInstances").json()["task_instances"]
    parts = [t for t in tis if t["task_id"] == "harvest.part"]
    assert len(parts) == 5 and {t["state"] for t in parts} == {"success"}, parts  # one per hour of the window


@pytest.mark.timeout(1500)
def test_production_cycle_survives_a_dead_worker(stack, api, scheduled, tmp_path):
    from rl_core.registry import store
    from rl_core.runtime.procs import stop
    from rl_core.serving import gateway as gw

    cfg = stack_cfg(stack)
    assert cfg.lake_root.startswith("s3://") and cfg.tracking_uri.startswith("http://")
    proc, url, w = serve_and_drive(cfg, tmp_path)
    try:
        assert keys(stack, LAKE_BUCKET, "lake/raw/"), "the gateway's traffic did not reach the S3 lake"
        run = api.post(f"/dags/{DAG}/dagRuns", json={"logical_date": None,
                                                     "conf": {"start": w.start.isoformat(), "end": w.end.isoformat()}})
        assert run.status_code == 200, run.text
        run_id = run.json()["dag_run_id"]
        deadline = time.time() + 900
        while task_states(api, run_id).get("train.train", ("", 0))[0] != "running":
            state = api.get(f"/dags/{DAG}/dagRuns/{run_id}").json()["state"]
            assert time.time() < deadline and state in ("queued", "running"), (state, task_states(api, run_id))
            time.sleep(1)
        time.sleep(3)  # the trainer is under way
        killed = kill_machine_of(stack, "rl_core.cli train")
        state = wait_run(api, run_id, 1200, lambda: (stack.logs / "airflow-scheduler.log").read_text()[-3000:])
        states = task_states(api, run_id)
        assert state == "success", states
        assert states["train.train"] == ("success", 2), (killed, states)  # the second try ran on the other worker
        ours = store.client(cfg).search_model_versions(f"name='{cfg.mlflow.model_name}' and tags.run_id = '{w.run_id}'")
        assert len(ours) == 1, [(v.version, v.tags) for v in ours]  # registered exactly once
        version = int(ours[0].version)
        assert store.aliases(cfg) == {"champion": 1, "challenger": version}
        run_artifacts = keys(stack, MLFLOW_BUCKET, "artifacts/")
        assert any(ours[0].run_id in k and k.endswith("config.json") for k in run_artifacts), ours[0].source
        assert keys(stack, LAKE_BUCKET, f"lake/runs/{w.run_id}/episodes.parquet")
        assert gw.wait_in_sync(cfg, url, 120) == {"champion": 1, "challenger": version}  # the gateway swapped
    finally:
        stop(proc)
