"""`rtrl collect compact`: compact the write-ahead log into the lake on demand (the gateway also does it
in the background). Safe while a gateway runs: its live segment is left alone (locked); segments of a
crashed gateway are sealed and compacted."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from rl_core.collect import wal
from rl_core.config import load_config


def add_collect(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    c = sub.add_parser("compact", help="compact sealed / orphaned WAL segments into Parquet partitions")
    c.add_argument("--json", action="store_true", help="print the result as JSON")
    c.set_defaults(run=_compact)
    s = sub.add_parser("status", help="count WAL segments waiting for compaction")
    s.set_defaults(run=_status)


def _compact(args) -> int:
    from rl_core.collect.compact import compact  # lazy: keeps rtrl --help fast (pyarrow)
    from rl_core.lake import Lake

    cfg = load_config()
    r = compact(cfg.wal_dir, Lake(cfg.lake_root))
    if args.json:
        print(json.dumps(asdict(r)))
    else:
        print(f"segments compacted {r.segments} (orphans sealed {r.orphans_sealed})")
        print(f"interactions       {r.rows_written['interactions']} written of {r.rows_read['interactions']} read")
        print(f"feedback           {r.rows_written['feedback']} written of {r.rows_read['feedback']} read")
        print(f"duplicates dropped {r.duplicates}")
    return 0


def _status(args) -> int:
    cfg = load_config()
    print(f"wal dir  {cfg.wal_dir}")
    print(f"sealed   {len(wal.sealed_segments(cfg.wal_dir))}")
    print(f"open     {len(wal.open_segments(cfg.wal_dir))}")
    return 0
