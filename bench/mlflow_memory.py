"""Benchmark: peak memory of `make mlflow`, the embedded MLflow UI (issue 41).

    .venv/bin/python bench/mlflow_memory.py [--settle 30] [--rounds 1] [--out PATH]

Each configuration starts `mlflow ui --workers 1` as `make mlflow` does (lab.stack.mlflow_ui: ui_argv, the
process in its own session via rl_core.runtime.procs.start) on a free port, in a fresh RTRL_HOME made by
`rtrl init --no-check` on the tiny profile (its SQLite store holds rtrl's experiments and the registered model),
and samples its whole process tree every 0.5 s (bench/airflow_memory.py's Sampler: the session leader and its
children, recursively, RSS and PSS): while it starts (until /health answers), while the pages a user opens are
fetched 3 times (the index page, /health, and the ajax API calls the UI makes for the experiments list, each
experiment's runs table and page, the models list and the registered model's page; each must answer 200), and for
a settle period.

Configurations, measured in the same invocation (one after the other, each from a fresh home):
- before: `make mlflow` before issue 41: the same argv without MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false in its
  environment (MLflow's default: its job queue, a job runner and huey consumers, beside the web worker).
- after: start_ui as it is (ui_env: NO_JOBS).
--rounds N measures them N times, alternating.

Reported per configuration: the peak of the summed RSS (pages shared between forked processes count once per
process), the peak of the summed PSS (shared pages split among their sharers: what the tree really holds), the
processes at the RSS peak, the most processes seen at once, seconds until /health answered (ready), the kinds of
process seen (whether MLflow's job queue ran) and the tree's memory at the end of the settle period. JSON: docs/results/mlflow-memory.json (--out).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("airflow_memory", REPO / "bench" / "airflow_memory.py")
am = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(am)  # also puts REPO on sys.path

API = "/ajax-api/2.0/mlflow"
ROUNDS = 3


# the Sampler's kinds (argv, with this run's temporary paths and port) -> a stable name; job: of MLflow's job queue
LABELS = (("mlflow.server.jobs._huey_consumer", "huey consumer (jobs)", True),
          ("mlflow.server.jobs._periodic_tasks", "huey consumer (periodic tasks)", True),
          ("mlflow.server.jobs._job_runner", "job runner", True),
          ("uvicorn", "uvicorn web worker", False), ("mlflow ui", "mlflow ui launcher", False))


def _label(kind: str) -> str:
    return next((name for key, name, _ in LABELS if key in kind), kind)


def _is_job_process(label: str) -> bool:
    return any(job for _, name, job in LABELS if name == label)


def _relabel(rows: list[dict]) -> list[dict]:
    return am._by_kind([{**r, "kind": _label(r["kind"])} for r in rows])


def fetch_pages(base: str, model: str, rounds: int = ROUNDS) -> dict[str, int]:
    """The UI's pages and the ajax calls its experiments list, runs tables and model pages make, `rounds` times;
    "METHOD path" -> status (the last round's). Raises when one does not answer 200."""
    import httpx

    got: dict[str, int] = {}
    with httpx.Client(base_url=base, timeout=60) as c:
        def call(method: str, path: str, **kw) -> httpx.Response:
            r = c.request(method, path, **kw)
            got[f"{method} {path}" + (f" {json.dumps(kw['json'])}" if "json" in kw else "")] = r.status_code
            return r

        for _ in range(rounds):
            call("GET", "/")
            call("GET", "/health")
            found = call("POST", f"{API}/experiments/search", json={"max_results": 100}).json()
            ids = sorted(e["experiment_id"] for e in found.get("experiments", []))
            for eid in ids:
                call("GET", f"{API}/experiments/get?experiment_id={eid}")
                call("POST", f"{API}/runs/search", json={"experiment_ids": [eid], "max_results": 100,
                                                         "order_by": ["attributes.start_time DESC"]})
            call("POST", f"{API}/runs/search", json={"experiment_ids": ids, "max_results": 100})
            call("GET", f"{API}/registered-models/search?max_results=25")
            call("GET", f"{API}/registered-models/get?name={model}")
            call("GET", f"{API}/model-versions/search?filter=name%3D%27{model}%27")
    bad = {k: v for k, v in got.items() if v != 200}
    if bad:
        raise RuntimeError(f"pages that did not answer 200: {bad}")
    return got


def measure(name: str, env: dict[str, str], log: Path, settle_s: float) -> dict:
    """Start the UI (before: without NO_JOBS in its environment), sample it through every phase, stop it."""
    from lab.stack.mlflow_ui import NO_JOBS, ui_argv, ui_env
    from rl_core.config import load_config
    from rl_core.runtime.procs import free_port, start, stop, wait_http

    cfg = load_config(REPO / "rtrl.toml", environ=env)
    port, out = free_port(), {"configuration": name}
    base_env = {k: v for k, v in env.items() if k not in NO_JOBS}
    ui_environ = ui_env(base_env) if name == "after" else base_env
    out["job_execution_env"] = ui_environ.get("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "(unset: MLflow's default)")
    base, proc = f"http://127.0.0.1:{port}", None
    with am.Sampler() as s:
        try:
            t0 = time.time()
            proc = start(ui_argv(cfg, port), ui_environ, log)
            s.pid = proc.pid  # sampled from its first moments
            wait_http(f"{base}/health", 180, proc, log)
            out["ready_s"] = round(time.time() - t0, 1)
            s.mark("pages")
            out["pages"] = fetch_pages(base, cfg.mlflow.model_name)
            s.mark("settle")
            time.sleep(settle_s)
            if last := s.sample():  # still growing at the end of the settle period?
                out["at_end"] = {"rss_mib": round(last["rss"] / am.MIB), "pss_mib": round(last["pss"] / am.MIB),
                                 "processes": len(last["rows"])}
        finally:
            stop(proc)
    peak = s.peaks["all"]
    out |= am._summary(peak)
    out["phases"] = {k: am._summary(v) for k, v in s.peaks.items() if k not in ("all", "ui")}
    out["at_peak"] = _relabel(peak["rows"])
    out["kinds_seen"] = sorted({_label(k) for k in s.kinds_seen})
    out["job_processes_at_peak"] = [f"{k['n']} x {k['kind']}" for k in out["at_peak"] if _is_job_process(k["kind"])]
    return out


def table(results: list[dict]) -> str:
    """One row per configuration and round; the peaks are over start, pages and settle."""
    lines = ["| configuration | peak RSS MiB | peak PSS MiB | processes at peak | max processes | ready s "
             "| job queue processes at peak | kinds seen |", "|---|---:|---:|---:|---:|---:|---|---|"]
    for r in results:
        jobs = ", ".join(r["job_processes_at_peak"]) or "none"
        lines.append(f"| {r['configuration']} #{r.get('round', 1)} | {r['peak_rss_mib']} | {r['peak_pss_mib']} "
                     f"| {r['processes_at_peak']} | {r['max_processes']} | {r['ready_s']} | {jobs} "
                     f"| {', '.join(r['kinds_seen'])} |")
    return "\n".join(lines)


def machine() -> dict:
    from importlib.metadata import version

    return am.machine() | {"mlflow": version("mlflow")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settle", type=float, default=30.0, help="seconds sampled after the pages (default 30)")
    ap.add_argument("--rounds", type=int, default=1, help="measure each configuration this many times, alternating")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "results" / "mlflow-memory.json")
    args = ap.parse_args()
    todo = [(i, n) for i in range(1, args.rounds + 1) for n in ("before", "after")]
    with tempfile.TemporaryDirectory(prefix="rtrl-mlflow-memory-") as tmp:
        with ThreadPoolExecutor(2) as pool:  # two homes at a time: `rtrl init` takes a while
            homes = list(pool.map(am.make_home, [Path(tmp) / f"{n}-{i}" for i, n in todo]))
        load = {"before": os.getloadavg()[0]}
        results = []
        for (i, n), env in zip(todo, homes, strict=True):
            got = measure(n, env, Path(env["RTRL_HOME"]).parent / "mlflow-ui.log", args.settle)
            results.append({"round": i} | got)
            print(f"[bench] {n} #{i}: {json.dumps({k: v for k, v in got.items() if k != 'pages'})}", flush=True)
        load["after"] = os.getloadavg()[0]
    doc = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(), "load_average_1m": load,
           "settle_s": args.settle, "interval_s": 0.5, "page_rounds": ROUNDS, "results": results}
    am.save(args.out, doc, table(results))


if __name__ == "__main__":
    main()
