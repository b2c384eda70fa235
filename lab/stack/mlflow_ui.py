"""The embedded MLflow UI (`make mlflow`): one web worker and no job queue, on the embedded store.

Why: `mlflow ui` starts, beside its web worker, MLflow's job execution (a job runner and seven huey consumer
processes, ~235 MiB each) that serves GenAI features rtrl does not use (scorers, prompt optimisation); measured
here (2-core Intel Xeon, 24 GB; bench/mlflow_memory.py) it held 2342 MiB RSS at peak over 10 processes, and 503 MiB over 2 with
MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false (docs/production.md, "Embedded UIs"). The production stack's server
(lab/stack/parts.py) runs with the same setting.

The links it prints open each experiment's runs table in MLflow's "Machine learning" mode with the deciding
columns (rl_core/registry/layout.runs_url); opening one also updates an older store's experiments to that layout.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rl_core.config import Config, load_config
from rl_core.runtime.procs import private_state, start, wait_http

# MLflow's job queue (huey consumers + job runner) off: rtrl uses no GenAI job
NO_JOBS = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def ui_argv(cfg: Config, port: int) -> list[str]:
    argv = [str(Path(sys.executable).parent / "mlflow"), "ui", "--backend-store-uri", cfg.tracking_uri,
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    if "://" not in cfg.artifact_root:
        argv += ["--default-artifact-root", Path(cfg.artifact_root).resolve().as_uri()]
    return argv


def ui_env(environ: dict[str, str]) -> dict[str, str]:
    return {**environ, **NO_JOBS}


def start_ui(cfg: Config, port: int, log: Path) -> subprocess.Popen:
    """The UI in its own session (stop it with rl_core.runtime.procs.stop), once it answers /health."""
    proc = start(ui_argv(cfg, port), ui_env(dict(os.environ)), log)
    wait_http(f"http://127.0.0.1:{port}/health", 180, proc, log)
    return proc


def links(cfg: Config, base: str) -> list[str]:
    """Where an operator starts: each experiment's runs table (deciding columns, ML mode) and the model."""
    from rl_core.registry import layout, store  # lazy: heavy (mlflow)

    lines = []
    for purpose, what in (("train", "checkpoints"), ("ab", "A/B analyses"), ("cycles", "cycle outcomes")):
        name = cfg.mlflow.experiment + store.PURPOSES[purpose]
        lines.append(f"{what:<16}{layout.runs_url(base, store.experiment_id(cfg, purpose), purpose)}   ({name})")
    lines.append(f"{'model':<16}{base}/#/models/{cfg.mlflow.model_name}?workflowType=machine_learning")
    return lines


def main() -> int:
    from rl_core.runtime.procs import serve_until_interrupted

    cfg = load_config()
    private_state(cfg, create_home=True)
    base = f"http://127.0.0.1:{cfg.mlflow.ui_port}"
    log = cfg.home_path / "logs" / "mlflow-ui.log"
    proc = start_ui(cfg, cfg.mlflow.ui_port, log)
    print(f"MLflow UI       {base}   (no login; store {cfg.tracking_uri}; log {log}; Ctrl-C stops it)")
    for line in links(cfg, base):
        print(line)
    return serve_until_interrupted([proc])


if __name__ == "__main__":
    sys.exit(main())
