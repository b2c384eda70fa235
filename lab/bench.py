"""`rtrl bench NAME`: run bench/NAME.py (each benchmark prints a markdown table of what it measured)."""

from __future__ import annotations

import argparse
import subprocess
import sys

from rl_core.config import REPO_ROOT

BENCH_DIR = REPO_ROOT / "bench"


def available() -> list[str]:
    return sorted(p.stem for p in BENCH_DIR.glob("*.py") if not p.name.startswith("_"))


def add_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="benchmark to run (omit to list them)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the benchmark")
    p.set_defaults(run=_run)


def _run(args) -> int:
    names = available()
    if not args.name:
        print("benchmarks:", ", ".join(names) or "(none)")
        return 0
    if args.name not in names:
        print(f"rtrl bench: unknown benchmark {args.name!r}; choose one of: {', '.join(names)}", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, str(BENCH_DIR / f"{args.name}.py"), *args.args], cwd=REPO_ROOT)
