"""How long the A/B verdict takes on 1M logged interactions (issue 7: "runs in seconds").

Simulated logs (lab.testing.ab_synth) with a planted +3-point edit-persisted effect are written to a
temporary lake as hourly Parquet partitions, then `ab_verdict` runs on them: DuckDB SQL over the raw
interactions + feedback, clustered delta-method intervals, a Poisson cluster bootstrap of p50/p90
latency (config [ab] bootstrap_iters), optionally CUPED over a pre-period, and the report logged to
MLflow on SQLite. Prints a markdown table.

    .venv/bin/python bench/ab_1m.py [--n 1000000] [--users 20000] [--iters 1000]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--users", type=int, default=20_000)
    ap.add_argument("--iters", type=int, default=1000, help="bootstrap iterations")
    ap.add_argument("--pre-n", type=int, default=500_000, help="pre-period interactions for CUPED")
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="rtrl-bench-ab-"))
    os.environ.update({"RTRL_HOME": str(home), "RTRL_AB__BOOTSTRAP_ITERS": str(args.iters)})
    from lab.testing import ab_synth
    from lab.testing.ab_synth import ArmSpec
    from rl_core.ab import verdict
    from rl_core.config import load_config
    from rl_core.lake import Lake

    cfg = load_config()
    start = datetime(2026, 12, 2, 5, tzinfo=timezone.utc)
    end = start + timedelta(hours=5)
    rows = []

    def timed(label, fn):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        rows.append((label, time.perf_counter() - t0, time.process_time() - c0))
        return out

    lake = Lake(cfg.lake_root)

    def simulate_and_write() -> int:
        events, feedback = timed("simulate logs (not part of the analysis)", lambda: ab_synth.synth_ab(
            args.n, args.users, start, end, ArmSpec(1, edit_persisted=0.30), ArmSpec(2, edit_persisted=0.33),
            seed=0, pre_hours=72, pre_n=args.pre_n))
        t0, c0 = time.perf_counter(), time.process_time()
        ab_synth.write_to_lake(lake, "interactions", events)
        ab_synth.write_to_lake(lake, "feedback", feedback)
        rows.append(("write Parquet partitions (not part of the analysis)", time.perf_counter() - t0,
                     time.process_time() - c0))
        return feedback.num_rows  # the tables go out of scope: the analysis reads the lake

    n_fb = simulate_and_write()
    r = timed("ab_verdict: SQL + intervals + bootstrap", lambda: verdict.ab_verdict(
        cfg, start, end, champion=1, challenger=2, cuped=False, log=False))
    rc = timed("ab_verdict with CUPED (pre-period SQL too)", lambda: verdict.ab_verdict(
        cfg, start, end, champion=1, challenger=2, cuped=True, log=False))
    from rl_core.ab import report

    timed("report: markdown + PNG + MLflow (first call creates the DB)", lambda: report.publish(cfg, r))
    timed("report again (MLflow run reused)", lambda: report.publish(cfg, r))

    shutil.rmtree(home, ignore_errors=True)
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    print("measured on: 2-core AMD EPYC, 24 GB, no GPU (shared with other jobs: compare CPU s)\n")
    print(f"{r.n['champion'] + r.n['challenger']:,} interactions in the window ({args.users:,} users), "
          f"{args.pre_n:,} pre-period, {n_fb:,} feedback events; bootstrap {args.iters} iterations\n")
    print("| step | wall s | CPU s |")
    print("|---|---:|---:|")
    for label, wall, cpu in rows:
        print(f"| {label} | {wall:.2f} | {cpu:.2f} |")
    m, mc = r.metrics["edit_persisted_rate"], rc.metrics["edit_persisted_rate"]
    print(f"\ndecision: {r.decision} (CUPED: {rc.decision}); edit_persisted diff {m.diff:+.4f} "
          f"[{m.lo:+.4f}, {m.hi:+.4f}], with CUPED [{mc.lo:+.4f}, {mc.hi:+.4f}]; peak RSS {rss_gb:.2f} GB")


if __name__ == "__main__":
    main()
