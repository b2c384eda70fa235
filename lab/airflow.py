"""The embedded Airflow's processes: the environment every airflow command runs with, the metadata DB prepared
once, and the scheduler, dag-processor and api-server started as one process group and signed into. Used by
`rtrl cycle` (lab/cycle.py), the DAG runs (lab/dagrun.py), the simulator and the production stack's
parts; it imports none of them.

Why not `airflow standalone` (issue 41): it also starts a triggerer (with its trigger runner and log server),
which only deferrable tasks need and rtrl has none, and stays resident itself as a full Airflow process beside
its children: ~0.6 GB of the 2.2-2.4 GB its process tree peaked at. `python -m lab.airflow` (launch)
starts the three other components `airflow standalone` would, their output prefixed with their names in one log
as it does, and stops them all on SIGTERM or when one exits; the dag-processor parses one file at a time
(LEAN_ENV). `start_airflow(..., standalone=True)` is the old way (bench/airflow_memory.py's baseline).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from rl_core.config import REPO_ROOT, Config
from rl_core.runtime.procs import start, wait_http


def bin_path(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def airflow_env(cfg: Config, **extra: str) -> dict[str, str]:
    """The environment every airflow command of the embedded stack runs with (rtrl's config included)."""
    env = dict(os.environ)
    env.update({
        "AIRFLOW_HOME": str(cfg.airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "RTRL_HOME": str(cfg.home_path),
        "RTRL_PROFILE": cfg.profile,
        "DS_ACCELERATOR": env.get("DS_ACCELERATOR", "cpu"),
        "HF_HUB_OFFLINE": env.get("HF_HUB_OFFLINE", "1"),
        "TOKENIZERS_PARALLELISM": "false",
        "GIT_PYTHON_REFRESH": "quiet",
        # tasks import rl_core and evals from this checkout, whatever the console script's sys.path is
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),  # standalone runs `airflow`
    })
    env.update(extra)
    return env


_PREPARED: set[tuple[str, str, int]] = set()


def prepare_airflow(cfg: Config, env: dict[str, str]) -> None:
    """`airflow db migrate` and the training pool: idempotent, ~6 s on SQLite, so once per process and
    metadata DB (an experiment's later cycles skip it)."""
    key = (str(cfg.airflow_home), cfg.airflow.training_pool, cfg.airflow.training_pool_slots)
    if key in _PREPARED and (cfg.airflow_home / "airflow.db").is_file():
        return
    cfg.airflow_home.mkdir(parents=True, exist_ok=True)
    airflow = bin_path("airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, text=True)
    subprocess.run([airflow, "pools", "set", cfg.airflow.training_pool, str(cfg.airflow.training_pool_slots),
                    "GPU/CPU-heavy rtrl tasks: training and eval"], env=env, check=True, capture_output=True)
    _PREPARED.add(key)


# What `airflow standalone` starts, minus the triggerer: no rtrl task defers (dags/, plugins/), so nothing would
# ever reach it. A DAG given a deferrable operator needs `airflow triggerer` started beside these (same env).
COMPONENTS = ("scheduler", "dag-processor", "api-server")
# One DAG file parsed at a time (Airflow's default: 2). Each parse is a fork of the dag-processor (~180 MiB RSS);
# dags/ holds two files, parsed in seconds, so two parsers at once only add a transient ~180 MiB to the peak.
LEAN_ENV = {"AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1"}


def start_airflow(cfg: Config, port: int, log: Path, standalone: bool = False,
                  **extra_env: str) -> tuple[subprocess.Popen, str]:
    """The scheduler, dag-processor (LEAN_ENV) and api-server on 127.0.0.1:port, one process group led by `launch`
    (standalone: `airflow standalone` with its triggerer and Airflow's defaults, as before issue 41); output
    appended to log.

    Returns the group's leader and the admin password (simple auth manager: the api-server writes it)."""
    env = airflow_env(cfg, **({} if standalone else LEAN_ENV), AIRFLOW__API__PORT=str(port),
                      AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{port}", **extra_env)
    prepare_airflow(cfg, env)
    argv = [bin_path("airflow"), "standalone"] if standalone else \
        [sys.executable, "-m", "lab.airflow", *COMPONENTS]
    proc = start(argv, env, log)
    wait_http(f"http://127.0.0.1:{port}/api/v2/monitor/health", 240, proc, log)
    pw_file = cfg.airflow_home / "simple_auth_manager_passwords.json.generated"
    for _ in range(30):
        if pw_file.exists():
            break
        time.sleep(1)
    password = json.loads(pw_file.read_text()).get("admin", "") if pw_file.exists() else ""
    return proc, password


def launch(components: list[str], grace_s: float = 20.0, airflow: str | None = None) -> int:
    """Run `airflow NAME` for each component in this process's group, each output line prefixed with its name
    as `airflow standalone` does, until SIGTERM/SIGINT or until one exits (then the others are stopped: a
    half-running Airflow would look alive to its callers). Returns the exit code of the one that exited (1 for
    0), else 0. airflow: the executable (default: this venv's)."""
    lock, stopping = threading.Lock(), []

    def say(name: str, line: bytes) -> None:
        with lock:
            sys.stdout.buffer.write(f"{name:<13} | ".encode() + line)
            sys.stdout.flush()

    def pump(name: str, pipe) -> None:
        for line in pipe:
            say(name, line)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    procs = {}
    for name in components:
        procs[name] = subprocess.Popen([airflow or bin_path("airflow"), name], stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        threading.Thread(target=pump, args=(name, procs[name].stdout), daemon=True).start()
    rc = 0
    while not stopping:
        if exited := [(n, p.returncode) for n, p in procs.items() if p.poll() is not None]:
            name, rc = exited[0]
            say("rtrl", f"airflow {name} exited with {rc}: stopping the others\n".encode())
            rc = rc or 1
            break
        time.sleep(0.5)
    _stop_components(list(procs.values()), grace_s, signalled=bool(stopping))
    return rc


def _stop_components(procs: list[subprocess.Popen], grace_s: float, signalled: bool) -> None:
    """SIGTERM, then SIGKILL after grace_s. Signalled: the signal usually reached the whole group (procs.stop_group),
    so they get half the grace to act on it before a second SIGTERM could cut their own shutdown short."""
    deadline = time.monotonic() + grace_s
    if signalled:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline - grace_s / 2:
            time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1:]))
