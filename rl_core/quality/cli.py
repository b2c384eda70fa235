"""`rtrl gate raw|episodes|rewards --run-id R [--start T --end T]`: run one data-quality gate."""

from __future__ import annotations

import argparse

from rl_core.config import load_config
from rl_core.harvest import _parse_ts
from rl_core.quality import gates
from rl_core.reports import GateFailed


def add_gate(p: argparse.ArgumentParser) -> None:
    p.add_argument("which", choices=["raw", "episodes", "rewards"])
    p.add_argument("--run-id", required=True)
    p.add_argument("--start", type=_parse_ts, help="window start (raw gate)")
    p.add_argument("--end", type=_parse_ts, help="window end (raw gate)")
    p.set_defaults(run=_run)


def _run(args) -> int:
    cfg = load_config()
    try:
        if args.which == "raw":
            if not (args.start and args.end):
                print("rtrl gate raw: --start and --end are required")
                return 2
            v = gates.gate_raw(cfg, args.start, args.end, args.run_id)
        elif args.which == "episodes":
            v = gates.gate_episodes(cfg, args.run_id)
        else:
            v = gates.gate_rewards(cfg, args.run_id)
    except GateFailed as exc:
        print(exc)
        return 1
    except (ValueError, FileNotFoundError) as exc:
        print(f"rtrl gate {args.which}: {exc}")
        return 2
    print(f"{v.name}: passed")
    return 0
