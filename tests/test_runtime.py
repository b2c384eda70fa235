"""rl_core/runtime: stop_group stops a process group gracefully or by force, and the dev-only warm fork server
stays off the production path (parsing the DAG, running a task)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rl_core.runtime import SOCKET_ENV
from rl_core.runtime.procs import group_alive, stop_group

REPO = Path(__file__).resolve().parent.parent

# a leader and a child in one fresh process group; "stubborn" ignores SIGTERM in both (as `airflow dags test` did)
GROUP = textwrap.dedent("""
    import signal, subprocess, sys, time
    if sys.argv[1] == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    kid = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\\n"
                            "if sys.argv[1] == 'stubborn': signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
                            "print('up', flush=True); time.sleep(120)", sys.argv[1]])
    print(kid.pid, flush=True)
    time.sleep(120)
""")


def _group(kind: str) -> tuple[subprocess.Popen, int]:
    """A started group whose handlers are in place (the leader printed its child's pid, the child 'up')."""
    p = subprocess.Popen([sys.executable, "-c", GROUP, kind], stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    kid = int(p.stdout.readline())
    assert p.stdout.readline().strip() == "up"
    return p, kid


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # exited, waiting for init to reap it
    except FileNotFoundError:
        return True


def test_groups_that_ignore_sigterm_are_killed_after_the_grace_all_at_once():
    a, b = _group("stubborn"), _group("stubborn")
    t0 = time.monotonic()
    assert stop_group([a[0], b[0].pid], grace_s=3.0, reap=b[0].poll) is True
    took = time.monotonic() - t0
    assert 3.0 <= took < 5.5, f"{took:.1f}s: the grace is shared, not one per group"
    assert a[0].returncode == b[0].returncode == -signal.SIGKILL
    assert not group_alive(a[0].pid) and not group_alive(b[0].pid)
    assert _gone(a[1]) and _gone(b[1])
    a[0].stdout.close(), b[0].stdout.close()


def test_a_group_that_exits_on_sigterm_is_reaped_without_sigkill():
    p, kid = _group("polite")
    t0 = time.monotonic()
    assert stop_group(p, grace_s=20.0) is False
    assert time.monotonic() - t0 < 5.0  # not the grace: it returns once the group is empty
    assert p.returncode == -signal.SIGTERM and not group_alive(p.pid) and _gone(kid)
    p.stdout.close()


def test_no_grace_kills_at_once_and_nothing_to_stop_is_fine():
    p, kid = _group("polite")
    assert stop_group(p, grace_s=0) is True and p.returncode == -signal.SIGKILL and _gone(kid)
    assert stop_group(p, grace_s=5.0) is False  # already gone
    assert stop_group(None) is False
    p.stdout.close()


PROBE = textwrap.dedent("""
    import json, os, sys
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    assert bag.import_errors == {} and "realtime_rl" in bag.dags, bag.import_errors
    import rl_core.train.launch  # what `rtrl train` (the train task's command) imports
    from rtrl_operators import DeepSpeedLaunchOperator

    op = DeepSpeedLaunchOperator(task_id="t", rtrl_run_id="r", base_version=1)
    warm = lambda: sorted(m for m in sys.modules if m in ("rl_core.warm", "lab.warm"))
    rc = op.run_streaming([sys.executable, "-c", "print('trained')"], 60)  # a task's job, no warm server named
    seen = {"parse_and_task": warm(), "rc": rc}
    from rl_core.runtime import SOCKET_ENV

    op.env = {SOCKET_ENV: "/nonexistent/sock"}  # a socket named, no launcher installed: still a plain process
    seen |= {"with_socket": warm(), "rc_socket": op.run_streaming([sys.executable, "-c", "print('trained')"], 60)}
    import lab.warm  # the control: the check sees the module once it is loaded
    print(json.dumps(seen | {"control": warm()}))
""")


@pytest.mark.timeout(300)
def test_parsing_the_dag_and_running_a_task_never_import_the_warm_server(rtrl_home, tmp_path):
    """The fork server is a dev tool (`rtrl experiment`); a dag-processor or a worker must not load it."""
    env = {k: v for k, v in os.environ.items() if k != SOCKET_ENV} | {
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "PYTHONPATH": os.pathsep.join([str(REPO / "dags"), str(REPO / "plugins"), str(REPO)]),
    }
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["parse_and_task"] == [] and seen["rc"] == 0
    assert seen["with_socket"] == [] and seen["rc_socket"] == 0
    assert seen["control"] == ["lab.warm"]  # the check can see it when it is loaded
