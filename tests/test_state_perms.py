"""State under RTRL_HOME is its user's alone (issue 44, item 3): the lake, the WAL and mlflow.db hold every
organisation's raw traffic, and a program run as another uid (the eval sandbox's throw-away uid, any other
account on the host) must read none of it. Each entry point sets umask 077 (rl_core.runtime.procs.private_state): the
`rtrl` command, the gateway process, the DAGs' task processes; the home folder is 0700.

Every check runs the real entry point in its own process, so the umask under test is the product's, not
pytest's."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _open_to_others(home: Path) -> list[str]:
    """Every path under home (home included) whose mode grants its group or others anything."""
    out = []
    for path in [home, *home.rglob("*")]:
        mode = path.lstat().st_mode
        if not stat.S_ISLNK(mode) and mode & 0o077:
            out.append(f"{stat.S_IMODE(mode):04o} {path.relative_to(home.parent)}")
    return out


@pytest.mark.timeout(300)
def test_init_and_a_gateway_run_leave_nothing_readable_by_others(rtrl_home, cfg, tmp_path):
    import httpx

    from rl_core.runtime.procs import stop
    from rl_core.serving import gateway as gw

    rtrl_home.chmod(0o755)  # a home made earlier, by hand or by an older rtrl: the command tightens it
    (rtrl_home / "mlflow.db").chmod(0o600)  # the fixture's copy stands for the db `rtrl init` makes (migrating: ~20 s)
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-m", "rl_core.cli", "init", "--no-check"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (rtrl_home / "models").is_dir() and (rtrl_home / "mlartifacts").is_dir()

    proc, url = gw.start_gateway(cfg, env, tmp_path / "gateway.log")  # `rtrl serve`: WAL, then the lake
    try:
        token = next(iter(cfg.serving.tokens))
        headers = {"Authorization": f"Bearer {token}"}
        chat = httpx.post(f"{url}/v1/chat/completions", headers=headers, timeout=60,
                          json={"model": "auto", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                "user": "u-1"})
        assert chat.status_code == 200, chat.text
        fb = httpx.post(f"{url}/v1/feedback", headers=headers, timeout=60,
                        json={"event_id": chat.headers["x-rtrl-event-id"], "kind": "thumbs", "value_bool": True})
        assert fb.status_code == 200, fb.text
    finally:
        stop(proc)  # SIGTERM: the gateway drains, seals its WAL and compacts it into the lake
    assert list((rtrl_home / "lake" / "raw" / "interactions").rglob("*.parquet")), "the event reached the lake"
    assert list((rtrl_home / "wal").iterdir()), "the WAL was written"
    assert _open_to_others(rtrl_home) == []


def test_a_dag_task_process_writes_private_files():
    """Airflow runs each task in a process that parses the DAG file first: that parse sets the umask."""
    code = ("import os, runpy, sys\n"
            "for dag in sys.argv[1:]:\n"
            "    os.umask(0o022)\n"
            "    runpy.run_path(dag)\n"
            "    print(dag, oct(os.umask(0o022)))\n")
    dags = [str(REPO / "dags" / "realtime_rl.py"), str(REPO / "dags" / "org_adapters.py")]
    r = subprocess.run([sys.executable, "-c", code, *dags], cwd=REPO, env=dict(os.environ), capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    umasks = [line.split() for line in r.stdout.splitlines() if line.startswith(str(REPO / "dags"))]
    assert umasks == [[dags[0], "0o77"], [dags[1], "0o77"]], r.stdout


def test_the_rtrl_command_makes_the_home_private_and_restores_the_callers_umask(rtrl_home):
    """In-process callers (tests, a notebook) get their umask back; the command's own process ends anyway. A home
    that holds another account's folder (the dev stack's PostgreSQL cluster, made as `postgres` by an older rtrl)
    keeps its mode: that server must still reach it."""
    from rl_core.cli import main

    rtrl_home.chmod(0o755)
    before = os.umask(0o022)
    try:
        assert main(["config", "show"]) == 0
        assert os.umask(0o022) == 0o022
    finally:
        os.umask(before)
    assert stat.S_IMODE(rtrl_home.stat().st_mode) == 0o700, "the command made the home private"
    if os.geteuid() != 0:
        return  # only root can give a folder to another account
    rtrl_home.chmod(0o755)
    pg = rtrl_home / "stack" / "pg"
    pg.mkdir(parents=True)
    os.chown(pg, 65534, 65534)
    assert main(["config", "show"]) == 0
    assert stat.S_IMODE(rtrl_home.stat().st_mode) == 0o755
