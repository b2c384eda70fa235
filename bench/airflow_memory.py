"""Benchmark: peak memory of `make airflow`, the embedded Airflow and its UI (issue 41).

    .venv/bin/python bench/airflow_memory.py [--settle 60] [--run] [--rounds 1] [--baseline | --lean] [--out PATH]

Each configuration starts the embedded Airflow as `make airflow` does (lab.airflow.start_airflow,
its environment from airflow_env) on a free port, in a fresh RTRL_HOME made by `rtrl init --no-check` on the
tiny profile, and samples its whole process tree every 0.5 s (psutil: the group leader and its children,
recursively): while it starts, while it is signed into over REST and the UI's pages are fetched (/, the
realtime_rl DAG's page and the API calls that page makes), and for a settle period. With --run, one run of
realtime_rl on an empty 1-minute window is triggered, as `rtrl cycle` triggers its run, and waited for (its task
processes count too).

Configurations, measured in the same invocation (one after the other, each from a fresh home):
- baseline: `make airflow` before issue 41, `airflow standalone` (start_airflow(standalone=True)): a resident
  Airflow process of its own, the scheduler, dag-processor, api-server and a triggerer.
- lean: start_airflow's default since issue 41: the scheduler, dag-processor (one parsing process, LEAN_ENV)
  and api-server under a small launcher (`python -m lab.airflow`), no triggerer.
--rounds N measures them N times, alternating (a peak depends on whether two DAG files were parsed at once).

Reported per configuration: the peak of the summed RSS (what `ps` and the issue count: pages shared between
forked processes count once per process), the peak of the summed PSS (shared pages split among their sharers:
what the tree really holds), the processes at the RSS peak, seconds until the health endpoint answered (ready)
and until realtime_rl was parsed. JSON: docs/results/airflow-memory.json (--out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DAG = "realtime_rl"
# the UI's pages (HTML: the single-page app) and the calls the home page and the DAG's page make
PAGES = ("/", f"/dags/{DAG}", "/api/v2/dags", f"/api/v2/dags/{DAG}", "/api/v2/monitor/health", "/ui/dags",
         "/ui/dashboard/dag_stats", f"/ui/grid/structure/{DAG}", f"/ui/grid/runs/{DAG}",
         f"/ui/structure/structure_data?dag_id={DAG}", f"/api/v2/dags/{DAG}/dagRuns")
MIB = 2**20


def _kind(p: psutil.Process) -> str:
    """A short name for a process of the tree: `airflow scheduler`, `airflow worker -- LocalExecutor: <idle>`."""
    argv = p.cmdline()
    if argv[:1] and "/" not in argv[0] and " " in " ".join(argv):  # a process that set its own title
        return " ".join(argv).split(" -- host")[0].strip()
    words = [Path(a).name if a.startswith("/") else a for a in argv if not a.startswith("-") or a == "-m"]
    if words and words[0].startswith("python"):
        words = words[1:]
    return " ".join(words)[:60]


class Sampler:
    """Samples the process tree under pid every interval_s in a thread; keeps the peaks per phase."""

    def __init__(self, interval_s: float = 0.5, pss: bool = True):
        self.interval_s, self.pss, self.pid, self.phase = interval_s, pss, None, "start"
        self.peaks: dict[str, dict] = {}
        self.kinds_seen: set[str] = set()
        self._stop, self._lock = threading.Event(), threading.Lock()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> dict | None:
        try:
            root = psutil.Process(self.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return None
        rows = []
        for p in tree:
            try:
                mem = p.memory_full_info() if self.pss else p.memory_info()
                rows.append({"pid": p.pid, "kind": _kind(p), "rss": mem.rss, "pss": getattr(mem, "pss", 0)})
            except psutil.Error:  # gone meanwhile
                continue
        return {"rss": sum(r["rss"] for r in rows), "pss": sum(r["pss"] for r in rows), "rows": rows}

    def mark(self, phase: str) -> None:
        """From now on samples count toward phase; one is taken at once (a phase may be shorter than interval_s)."""
        self.phase = phase
        self._record()

    def _record(self) -> None:
        if self.pid is None or not (s := self.sample()):
            return
        with self._lock:
            self.kinds_seen.update(r["kind"] for r in s["rows"])
            for key in (self.phase, "all", *(("ui",) if self.phase != "run" else ())):  # ui: all but a run
                peak = self.peaks.setdefault(key, {"rss": 0, "pss": 0, "rows": [], "max_processes": 0})
                peak["max_processes"] = max(peak["max_processes"], len(s["rows"]))
                peak["pss"] = max(peak["pss"], s["pss"])
                if s["rss"] > peak["rss"]:
                    peak["rss"], peak["rows"] = s["rss"], s["rows"]

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._record()
            self._stop.wait(self.interval_s)


def fetch_pages(base: str, password: str, rounds: int = 3) -> dict[str, int]:
    """Sign in over REST (as tests/test_dag_scheduler.py does) and fetch PAGES `rounds` times; path -> status."""
    import httpx

    token = httpx.post(f"{base}/auth/token", json={"username": "admin", "password": password}, timeout=30)
    token.raise_for_status()
    headers = {"Authorization": f"Bearer {token.json()['access_token']}"}
    got: dict[str, int] = {}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as c:
        for _ in range(rounds):
            for path in PAGES:
                got[path] = c.get(path).status_code
    return got


def wait_dag(api, deadline_s: float = 240) -> float:
    t0 = time.time()
    while api.get(f"/dags/{DAG}").status_code != 200:  # the dag-processor has not parsed it yet
        if time.time() - t0 > deadline_s:
            raise TimeoutError(f"{DAG} not parsed after {deadline_s:.0f}s")
        time.sleep(1)
    return time.time() - t0


def run_once(api, deadline_s: float) -> str:
    """A run of the DAG on an empty 1-minute window that has ended (as `rtrl cycle` triggers its run); its state."""
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=2)
    body = {"logical_date": datetime.now(UTC).isoformat(), "data_interval_start": (end - timedelta(minutes=1)).isoformat(),
            "data_interval_end": end.isoformat(), "conf": {}}
    api.patch(f"/dags/{DAG}", json={"is_paused": False})
    r = api.post(f"/dags/{DAG}/dagRuns", json=body)
    r.raise_for_status()
    run_id, t0, state = r.json()["dag_run_id"], time.time(), None
    while state not in ("success", "failed") and time.time() - t0 < deadline_s:
        time.sleep(3)
        got = api.get(f"/dags/{DAG}/dagRuns/{run_id}")
        state = got.json().get("state") if got.status_code == 200 else state
    return f"{state} after {time.time() - t0:.0f}s" if state in ("success", "failed") else f"{state} at deadline"


def make_home(root: Path) -> dict[str, str]:
    """A fresh RTRL_HOME under root with the tiny model registered (`rtrl init --no-check`); its environment."""
    env = {**os.environ, "RTRL_PROFILE": "tiny", "RTRL_HOME": str(root / "var"), "RTRL_CONFIG": str(REPO / "rtrl.toml")}
    done = subprocess.run([str(Path(sys.executable).parent / "rtrl"), "init", "--no-check"], env=env, cwd=REPO,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"rtrl init failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return env


def _summary(peak: dict) -> dict:
    return {"peak_rss_mib": round(peak["rss"] / MIB), "peak_pss_mib": round(peak["pss"] / MIB),
            "processes_at_peak": len(peak["rows"]), "max_processes": peak["max_processes"]}


def start_sampled(s: Sampler, cfg, port: int, log: Path, **kw) -> tuple:
    """start_airflow(cfg, port, log, **kw) with s sampling the group from its leader's first moments (start_airflow
    returns only once the api-server answers); (leader, password, seconds until it returned)."""
    from lab.airflow import start_airflow

    result: list = []
    t0 = time.time()
    starting = threading.Thread(target=lambda: result.append(start_airflow(cfg, port, log, **kw)), daemon=True)
    starting.start()
    while starting.is_alive() and s.pid is None:
        s.pid = _leader()
        time.sleep(0.1)
    starting.join()
    if not result:
        raise RuntimeError(f"Airflow did not start (log {log}):\n{log.read_text()[-3000:] if log.exists() else ''}")
    proc, password = result[0]
    s.pid = proc.pid
    return proc, password, round(time.time() - t0, 1)


def _leader() -> int | None:
    """The group leader start_airflow is starting (`airflow standalone` or lab.airflow's launcher)."""
    for p in psutil.Process().children():
        try:
            argv = p.cmdline()
        except psutil.Error:
            continue
        if argv[1:2] == ["standalone"] or "lab.airflow" in argv:
            return p.pid
    return None


def measure(name: str, env: dict[str, str], log: Path, settle_s: float, run: bool) -> dict:
    """Start the embedded Airflow (baseline: standalone=True), sample it through every phase, stop it."""
    import httpx

    from rl_core.config import load_config
    from rl_core.runtime.procs import free_port, stop

    cfg = load_config(REPO / "rtrl.toml", environ=env)
    port, out = free_port(), {"configuration": name}
    # its own log-server ports: another Airflow on this machine must not hold them (a server that failed to
    # start would be memory not measured); with --run, no scheduled run beside ours (as `rtrl cycle`)
    extra = {"RTRL_CONFIG": env["RTRL_CONFIG"], "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
             "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port())}
    if run:
        extra["AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE"] = "False"
    proc = None
    with Sampler() as s:
        try:
            proc, password, out["ready_s"] = start_sampled(s, cfg, port, log, standalone=name == "baseline", **extra)
            base = f"http://127.0.0.1:{port}"
            token = httpx.post(f"{base}/auth/token", json={"username": "admin", "password": password}).json()
            api = httpx.Client(base_url=f"{base}/api/v2", timeout=60,
                               headers={"Authorization": f"Bearer {token['access_token']}"})
            out["dag_parsed_s"] = round(out["ready_s"] + wait_dag(api), 1)
            s.mark("pages")
            out["pages"] = fetch_pages(base, password)
            s.mark("settle")
            time.sleep(settle_s)
            if run:
                s.mark("run")
                out["run"] = run_once(api, 300)
        finally:
            stop(proc)
    out |= _summary(s.peaks["ui"])  # `make airflow` with its UI in use; a run's task processes come on top
    if run:
        out["with_run"] = _summary(s.peaks["all"]) | {"at_peak": _by_kind(s.peaks["all"]["rows"])}
    out["phases"] = {k: _summary(v) for k, v in s.peaks.items() if k not in ("all", "ui")}
    out["at_peak"] = _by_kind(s.peaks["ui"]["rows"])
    out["kinds_seen"] = sorted(s.kinds_seen)
    out["triggerer"] = any("triggerer" in k for k in s.kinds_seen)
    return out


def _by_kind(rows: list[dict]) -> list[dict]:
    kinds: dict[str, dict] = {}
    for r in rows:
        k = kinds.setdefault(r["kind"], {"kind": r["kind"], "n": 0, "rss_mib": 0.0, "pss_mib": 0.0})
        k["n"] += 1
        k["rss_mib"] += r["rss"] / MIB
        k["pss_mib"] += r["pss"] / MIB
    return sorted(({**k, "rss_mib": round(k["rss_mib"]), "pss_mib": round(k["pss_mib"])} for k in kinds.values()),
                  key=lambda k: -k["rss_mib"])


def table(results: list[dict]) -> str:
    """One row per configuration; the peaks are of start, pages and settle (a run's peak in its own column)."""
    lines = ["| configuration | peak RSS MiB | peak PSS MiB | processes | ready s | DAG parsed s | triggerer "
             "| with a run: peak RSS MiB (PSS) |", "|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in results:
        w = r.get("with_run")
        ran = f"{w['peak_rss_mib']} ({w['peak_pss_mib']}), run {r['run']}" if w else "not run"
        lines.append(f"| {r['configuration']} #{r.get('round', 1)} | {r['peak_rss_mib']} | {r['peak_pss_mib']} | {r['processes_at_peak']} "
                     f"| {r['ready_s']} | {r['dag_parsed_s']} | {'yes' if r['triggerer'] else 'no'} | {ran} |")
    return "\n".join(lines)


def machine() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    from importlib.metadata import version

    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "airflow": version("apache-airflow")}


def save(out: Path, doc: dict, printed: str) -> None:
    """The run's JSON to out, its table to stdout (bench/mlflow_memory.py too)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(printed)
    print(f"\nwritten {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settle", type=float, default=60.0, help="seconds sampled after the pages (default 60)")
    ap.add_argument("--run", action="store_true", help="also trigger one run on an empty window and wait for it")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--baseline", action="store_true", help="only the before configuration (airflow standalone)")
    only.add_argument("--lean", action="store_true", help="only the after configuration (start_airflow's default)")
    ap.add_argument("--rounds", type=int, default=1, help="measure each configuration this many times, alternating")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "results" / "airflow-memory.json")
    args = ap.parse_args()
    names = ["baseline"] if args.baseline else ["lean"] if args.lean else ["baseline", "lean"]
    todo = [(i, n) for i in range(1, args.rounds + 1) for n in names]
    with tempfile.TemporaryDirectory(prefix="rtrl-airflow-memory-") as tmp:
        with ThreadPoolExecutor(2) as pool:  # two homes at a time: `rtrl init` is ~30 s here
            homes = list(pool.map(make_home, [Path(tmp) / f"{n}-{i}" for i, n in todo]))
        load = {"before": os.getloadavg()[0]}
        results = []
        for (i, n), env in zip(todo, homes, strict=True):
            got = measure(n, env, Path(env["RTRL_HOME"]).parent / "airflow.log", args.settle, args.run)
            results.append({"round": i} | got)
            print(f"[bench] {n} #{i}: {json.dumps({k: v for k, v in got.items() if k != 'pages'})}", flush=True)
        load["after"] = os.getloadavg()[0]
    doc = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(), "load_average_1m": load,
           "settle_s": args.settle, "interval_s": 0.5, "results": results}
    save(args.out, doc, table(results))


if __name__ == "__main__":
    main()
