"""Cycle-time breakdown: wall time of each stage of one real cycle, and the share that is overhead.

    python bench/cycle_time.py [--interactions N]      (RTRL_PROFILE / RTRL_HOME pick the stack; default: a
                                                         fresh temp home, so nothing of yours is touched)
    RTRL_HOME=H python bench/cycle_time.py --experiment OUT   (no new cycle: the last cycle of an
                                                         `rtrl experiment --out OUT` run with RTRL_HOME=H)

Runs lab.cycle.run_cycle once (init, gateway, simulated traffic, compaction, `airflow dags test`), then
reads what happened from the files: the cycle's own timings, each Airflow task's start/end from the
Airflow metadata DB, and the compute inside them. "Compute" is only
  - generation while serving: the union of [ts_request, ts_response] of the cycle's logged interactions,
  - generation during the eval: each policy's summed per-task model latency / eval workers,
  - training: the trainer's summed optimizer-step time (MLflow metric history, else tokens / tokens_per_s);
everything else (process and model start-up, Airflow, sandboxed tests, harvest, rewards, gates, MLflow,
compaction) is overhead. Prints a markdown table. Target: overhead <= 5% of the cycle.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def airflow_tasks(cfg, back: int = 0) -> list[tuple[str, float]]:
    """(task_id, seconds) of the latest run of the DAG (back=1: the one before, ...), in start order (from
    Airflow's SQLite metadata DB)."""
    db = cfg.airflow_home / "airflow.db"
    if not db.is_file():
        return []
    con = sqlite3.connect(db)
    try:
        run = con.execute("SELECT run_id FROM dag_run WHERE dag_id=? ORDER BY id DESC LIMIT 1 OFFSET ?",
                          (cfg.airflow.dag_id, back)).fetchone()
        if not run:
            return []
        rows = con.execute("SELECT task_id, start_date, end_date FROM task_instance WHERE dag_id=? AND run_id=? "
                           "AND start_date IS NOT NULL ORDER BY start_date", (cfg.airflow.dag_id, run[0])).fetchall()
    finally:
        con.close()
    out = []
    for task_id, s, e in rows:
        if e:
            out.append((task_id, (datetime.fromisoformat(e) - datetime.fromisoformat(s)).total_seconds()))
    return out


def serving_generation_s(lake, start, end) -> float:
    t = lake.read_window("interactions", start, end)
    if t is None or not t.num_rows:
        return 0.0
    # read_window returns whole partitions: keep the requests of [start, end) only (earlier cycles share them)
    spans = sorted((s, e) for s, e in zip(t["ts_request"].to_pylist(), t["ts_response"].to_pylist(), strict=True)
                   if start <= s < end)
    total, cur_s, cur_e = 0.0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += (cur_e - cur_s).total_seconds()
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += (cur_e - cur_s).total_seconds()
    return total


def eval_generation_s(cfg, lake, run_id: str) -> float:
    p = f"{lake.run(run_id).eval}/results.parquet"
    if not lake.exists(p):
        return 0.0
    t = lake.read_parquet(p)
    cached = t["cached"].to_pylist() if "cached" in t.column_names else [False] * t.num_rows
    # a side read back from the eval cache generated nothing this cycle
    ran = [ms for ms, c in zip(t["latency_ms"].to_pylist(), cached, strict=True) if not c]
    return sum(ran) / 1000 / max(cfg.eval.workers, 1)


def training_compute_s(cfg, lake, run_id: str) -> float:
    p = lake.run(run_id).train_summary
    if not lake.exists(p):
        return 0.0
    s = lake.read_json(p)
    if s.get("mlflow_run_id"):
        from rl_core.registry import store

        client = store.client(cfg)
        for key in ("train/step_s", "step_s"):  # the trainer's name; "step_s" in runs before the train/ prefix
            hist = client.get_metric_history(s["mlflow_run_id"], key)
            if hist:
                return sum(m.value for m in hist)
    tokens = (s.get("data") or {}).get("tokens")
    return tokens / s["tokens_per_s"] if tokens and s.get("tokens_per_s") else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--interactions", type=int, default=None)
    ap.add_argument("--experiment", default=None, help="an experiment's --out folder: break down its last cycle")
    ap.add_argument("--cycle", type=int, default=None,
                    help="with --experiment: which cycle (1-based; default the last; e.g. when the last one stopped "
                         "at a gate and ran no training)")
    args = ap.parse_args()
    if args.experiment and not os.environ.get("RTRL_HOME"):
        sys.exit("--experiment needs the RTRL_HOME the experiment ran with")
    if not os.environ.get("RTRL_HOME"):
        os.environ["RTRL_HOME"] = tempfile.mkdtemp(prefix="rtrl-bench-cycle-")
    from lab.cycle import run_cycle
    from rl_core.config import load_config
    from rl_core.lake import Lake

    cfg = load_config()
    lake = Lake(cfg.lake_root)
    if args.experiment:
        curves = json.loads((Path(args.experiment) / "curves.json").read_text())
        k = args.cycle or len(curves)
        if not 1 <= k <= len(curves):
            sys.exit(f"--cycle must be in 1..{len(curves)}, got {k}")
        last, back = curves[k - 1], len(curves) - k  # one DAG run per cycle, in order
        h = lake.read_harvest(last["run_id"])
        if h is None:
            sys.exit(f"run {last['run_id']} has no harvest manifest in {cfg.lake_root}")
        report = SimpleNamespace(run_id=last["run_id"], start=h.start, end=h.end, seconds=last["seconds"],
                                 dag_rc=last["dag_rc"], interactions=last["interactions"])
    else:
        report, back = run_cycle(cfg, interactions=args.interactions), 0
    start, end = datetime.fromisoformat(report.start), datetime.fromisoformat(report.end)
    secs = dict(report.seconds or {})
    # not part of the cycle: idle until the previous cycle's window (minute-rounded) has ended, which only
    # happens after a cycle that stopped early (a gate); a scheduled cycle starts hours after that window
    idle = secs.pop("wait_window", 0.0)
    total = sum(secs.values())
    rows = [(f"cycle: {k}", v) for k, v in secs.items()]
    rows += [(f"  airflow task {t}", s) for t, s in airflow_tasks(cfg, back)]
    gen = serving_generation_s(lake, start, end)
    ev = eval_generation_s(cfg, lake, report.run_id)
    tr = training_compute_s(cfg, lake, report.run_id)
    compute = gen + ev + tr
    rows += [("compute: generation (serving)", gen), ("compute: generation (eval)", ev), ("compute: training", tr),
             ("overhead (total - compute)", total - compute)]
    print(f"\n### cycle-time breakdown: profile {cfg.profile}, base {cfg.model.base}, run {report.run_id}, "
          f"DAG rc {report.dag_rc}, {report.interactions} interactions\n")
    print("| stage | wall s | share of cycle |\n|---|---|---|")
    for name, s in rows:
        print(f"| {name} | {s:.1f} | {s / total:.1%} |")
    print(f"| **total** | {total:.1f} | 100% |")
    if idle:
        print(f"\n(not counted: {idle:.1f} s idle before the cycle, waiting for the previous window to end)")
    share = (total - compute) / total if total else float("nan")
    print(f"\noverhead share: {share:.1%} (target <= 5%)")
    return 0 if report.dag_rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
