"""Benchmark: the harvest at production scale, on the production stack (`rtrl stack`, issue 23).

    .venv/bin/python bench/harvest_scale.py [--n 10000000] [--dag-n 2000000] [--chunks 20] [--no-dag] [--limits 3GB,2.5GB]

1. Generates a 5-hour window of --n interactions with their feedback (lab.testing.synth, in --chunks
   chunks; not timed) into an embedded (local) lake, and a second, earlier window of --dag-n interactions.
   This bench's own process peaks at ~9.7 GB at 10M (`/usr/bin/time -v`), hence the fresh harvest processes.
2. Starts the stack on free ports in a temporary folder (PostgreSQL, Redis, the S3 server, the MLflow
   server, Airflow with the CeleryExecutor and two workers) and copies both windows into its S3 lake.
3. Harvests the big window in a fresh process from each lake (`rl_core.harvest.harvest`, as the DAG's task
   does): wall seconds and the process's peak RSS (VmHWM: interpreter and imports included; see peak_rss_gb).
   Target: peak RSS under 4 GB from S3.
4. Over Airflow's REST API, a dry-run DAG run of the second window with `map_hours` 0 (one harvest task),
   then one with `map_hours` 1 (five mapped tasks on the two Celery workers), each stopped once its harvest
   group is done: the group's wall time from its task instances, and the two runs' episodes compared.
Prints markdown tables, each row as it is measured. Needs Debian's postgresql and redis-server (`make sysdeps`) and an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.testing.synth import ArmSpec, generate, window  # noqa: E402
from rl_core.runtime.procs import environ  # noqa: E402

DAG = "realtime_rl"
BIG = window()  # [2026-12-02T05:00Z, 10:00Z)
SMALL = window(end=BIG[0])  # the 5 hours before it
ARMS = (ArmSpec(name="champion", model_version=1, share=1.0),)  # the stack's champion is version 1


def fill(lake_root: str, n: int, start: datetime, end: datetime, chunks: int, seed: int) -> float:
    """n interactions in [start, end), chunk k in the k-th slice of the window; returns seconds."""
    from rl_core.lake import Lake

    lake, step, t = Lake(lake_root), (end - start) / chunks, time.perf_counter()
    for k in range(chunks):
        generate(n // chunks, start + k * step, start + (k + 1) * step, seed=seed + k, lake=lake, arms=ARMS)
    return time.perf_counter() - t


def peak_rss_gb() -> float:
    """This process's peak resident memory: VmHWM, the high-water mark of its own address space. Not ru_maxrss:
    Linux carries the parent's peak into a child across fork (or vfork) and exec, so a harvest child's ru_maxrss
    reported this bench's generator (9.2 GB at 10M) until 2026-12-05, whatever the harvest used."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20  # kB -> GiB
    raise RuntimeError("no VmHWM in /proc/self/status: this bench measures memory on Linux only")


def child_harvest(start: str, end: str, run_id: str) -> None:
    """In a fresh process: one harvest of the window; prints its wall time, episodes and peak RSS as JSON."""
    from rl_core.config import load_config
    from rl_core.harvest import harvest

    t = time.perf_counter()
    r = harvest(load_config(), datetime.fromisoformat(start), datetime.fromisoformat(end), 1, run_id)
    print(json.dumps({"wall_s": time.perf_counter() - t, "episodes": r.n_episodes,
                      "rss_gb": peak_rss_gb()}))


def measure_harvest(env: dict[str, str], run_id: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", BIG[0].isoformat(), BIG[1].isoformat(), run_id],
                         env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"harvest child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def api_client(stack):
    client = stack.airflow_api(timeout=60, wait_for=DAG)
    # a paused DAG's manual runs stay queued; unpaused, the scheduler first runs the latest grid interval (no
    # traffic there: it skips at harvest) and the manual runs queue behind it (max_active_runs 1)
    client.patch(f"/dags/{DAG}", json={"is_paused": False}).raise_for_status()
    return client


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def harvest_group(api, map_hours: int, timeout_s: float = 3600) -> dict:
    """A dry-run manual run of the small window; waits for harvest.harvest, then stops the run. Returns the
    harvest group's wall time (plan's start to harvest's end) and the number of mapped part tasks."""
    body = {"logical_date": None, "conf": {"start": SMALL[0].isoformat(), "end": SMALL[1].isoformat(),
                                           "dry_run": True, "map_hours": map_hours}}
    run = api.post(f"/dags/{DAG}/dagRuns", json=body)
    run.raise_for_status()
    run_id, deadline = run.json()["dag_run_id"], time.time() + timeout_s
    while True:
        tis = api.get(f"/dags/{DAG}/dagRuns/{run_id}/taskInstances", params={"limit": 100}).json()["task_instances"]
        by = {(t["task_id"], t["map_index"]): t for t in tis}
        done = by.get(("harvest.harvest", -1), {}).get("state")
        if done in ("success", "skipped", "failed", "upstream_failed"):
            break
        if time.time() > deadline:
            raise RuntimeError(f"harvest not done in {timeout_s} s: {[(k, t['state']) for k, t in by.items()]}")
        time.sleep(2)
    api.patch(f"/dags/{DAG}/dagRuns/{run_id}", json={"state": "failed"})  # the rest of the cycle is not measured
    if done != "success":
        raise RuntimeError(f"harvest.harvest ended {done} in {run_id}")
    parts = [t for (tid, _), t in by.items() if tid == "harvest.part"]
    spans = [(_ts(t["start_date"]), _ts(t["end_date"])) for t in parts]
    # the most part tasks running at one moment: both workers share this machine's hostname, so the overlap
    # of the task instances' spans is what shows the mapping spread over them
    at_once = max(sum(a <= t < b for a, b in spans) for t, _ in spans)
    return {"wall_s": (_ts(by[("harvest.harvest", -1)]["end_date"]) - _ts(by[("harvest.plan", -1)]["start_date"]))
            .total_seconds(), "tasks": len(parts), "part_s": sum(t["duration"] or 0 for t in parts), "at_once": at_once}


def episodes_of(cfg):
    from rl_core.lake import Lake
    from rl_core.window import run_id_for

    lake = Lake(cfg.lake_root)
    return lake.read_parquet(lake.run(run_id_for(*SMALL, cfg.airflow.schedule_hours)).episodes)


def upload(local: str, stack) -> None:
    import s3fs

    from lab.stack.parts import LAKE_BUCKET

    fs = s3fs.S3FileSystem(key="rtrl-stack", secret="rtrl-stack", client_kwargs={"endpoint_url": stack.s3_url})
    files = sorted(str(p.relative_to(local)) for p in Path(local, "raw").rglob("*.parquet"))
    fs.put([f"{local}/{f}" for f in files], [f"{LAKE_BUCKET}/lake/{f}" for f in files])  # the same keys as on disk
    if len(fs.find(f"{LAKE_BUCKET}/lake/raw")) != len(files):
        raise RuntimeError("the S3 lake does not hold every file of the local one")


def run(args, tmp: Path) -> None:
    """Prints each table row as soon as it is measured (a late failure keeps the rows before it)."""
    from lab.stack.cli import down, up
    from lab.stack.parts import Ports, Stack
    from rl_core.config import load_config

    local = str(tmp / "lake")
    gen_s = fill(local, args.n, *BIG, args.chunks, seed=100) + fill(local, args.dag_n, *SMALL, 4, seed=200)
    print(f"generated {args.n:,} + {args.dag_n:,} interactions in {gen_s:.0f} s (not timed below)", flush=True)
    s = Stack(tmp / "stack", Ports.free())
    base = {**os.environ, "RTRL_PROFILE": "tiny"}
    with environ({**base, **s.env()}):
        try:
            up(s)
            upload(local, s)
            say(f"Harvest of one 5-hour window of {args.n:,} interactions (policy v1, every turn an episode):", "",
                "| lake | duckdb_memory_limit | episodes | wall s | interactions/s | peak RSS GiB |",
                "|---|---|---:|---:|---:|---:|")
            default = load_config().harvest.duckdb_memory_limit
            for limit in args.limits.split(",") if args.limits else [default]:
                for name, env, run_id in (("embedded (local disk)", {**base, "RTRL_HOME": str(tmp / "home"),
                                                                       "RTRL_LAKE__ROOT": local}, "scale-local"),
                                          ("S3 (stack's moto server; s3fs + DuckDB)", {**base, **s.env()}, "scale-s3")):
                    r = measure_harvest({**env, "RTRL_HARVEST__DUCKDB_MEMORY_LIMIT": limit}, run_id)
                    shown = f"{limit} (default)" if limit == default else limit
                    say(f"| {name} | {shown} | {r['episodes']:,} | {r['wall_s']:.1f} | {args.n / r['wall_s']:,.0f} | "
                        f"{r['rss_gb']:.2f} |")
            if args.no_dag:
                return
            say("", f"The DAG's harvest group over {args.dag_n:,} interactions on the stack (two Celery workers, "
                "S3 lake):", "", "| harvest | tasks | most running at once | group wall s | sum of part task s |",
                "|---|---:|---:|---:|---:|")
            api, episodes = api_client(s), []
            for name, map_hours in (("one task (map_hours 0)", 0), ("by hour (map_hours 1)", 1)):
                r = harvest_group(api, map_hours)
                episodes.append(episodes_of(load_config()))
                say(f"| {name} | {r['tasks']} | {r['at_once']} | {r['wall_s']:.1f} | {r['part_s']:.1f} |")
            say("", f"episodes identical: {episodes[0].equals(episodes[1])} ({episodes[0].num_rows:,} rows)")
        finally:
            down(s, purge=True)


def say(*lines: str) -> None:
    print("\n".join(lines), flush=True)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child_harvest(*sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000_000, help="interactions in the big window")
    ap.add_argument("--dag-n", type=int, default=2_000_000, help="interactions in the DAG runs' window")
    ap.add_argument("--chunks", type=int, default=20, help="generator chunks for the big window")
    ap.add_argument("--no-dag", action="store_true", help="the harvest table only (no DAG runs)")
    ap.add_argument("--limits", default="", help="harvest.duckdb_memory_limit values to measure, comma-separated, "
                                                  "each from both lakes (default: the config's; the DAG runs use it)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rtrl-scale-") as tmp:
        run(args, Path(tmp))


if __name__ == "__main__":
    main()
