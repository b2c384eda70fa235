"""The embedded Airflow's processes: the environment every airflow command runs with, the metadata DB prepared
once, and `airflow standalone` started and signed into. Used by `rtrl cycle` (rl_core/cycle.py), the DAG runs
(rl_core/dagrun.py), the simulator and the production stack's parts; it imports none of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def start_airflow(cfg: Config, port: int, log: Path, **extra_env: str) -> tuple[subprocess.Popen, str]:
    """`airflow standalone` (scheduler, dag-processor, api-server, triggerer) on 127.0.0.1:port.

    Returns the process and the admin password (simple auth manager)."""
    env = airflow_env(cfg, AIRFLOW__API__PORT=str(port), AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{port}",
                      **extra_env)
    prepare_airflow(cfg, env)
    proc = start([bin_path("airflow"), "standalone"], env, log)
    wait_http(f"http://127.0.0.1:{port}/api/v2/monitor/health", 240, proc, log)
    pw_file = cfg.airflow_home / "simple_auth_manager_passwords.json.generated"
    for _ in range(30):
        if pw_file.exists():
            break
        time.sleep(1)
    password = json.loads(pw_file.read_text()).get("admin", "") if pw_file.exists() else ""
    return proc, password
