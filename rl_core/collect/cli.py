"""`rtrl collect compact`: compact the write-ahead log into the lake on demand (the gateway also does it
in the background). Safe while a gateway runs: its live segment is left alone (locked); segments of a
crashed gateway are sealed and compacted; rows that cannot be written are quarantined with their reason.
`rtrl collect status`: segments waiting, quarantined rows and the newest one's reason, pending forgets."""

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
    s = sub.add_parser("status", help="WAL segments waiting for compaction, quarantined rows and the last error")
    s.add_argument("--json", action="store_true", help="print the status as JSON")
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
        print(f"forgotten dropped  {r.forgotten}")
        print(f"quarantined        {r.quarantined['interactions']} interactions, {r.quarantined['feedback']} feedback")
        if r.last_error:
            print(f"last error         {r.last_error}")
        if r.forgets_resumed:
            print(f"forgets resumed    {r.forgets_resumed} (left pending by a crash)")
    return 0


def _status(args) -> int:
    from rl_core.collect import quarantine  # lazy: pyarrow
    from rl_core.forget import load_registry
    from rl_core.lake import Lake

    cfg = load_config()
    lake = Lake(cfg.lake_root)
    q = quarantine.status(lake)
    st = {"wal_dir": str(cfg.wal_dir), "sealed": len(wal.sealed_segments(cfg.wal_dir)),
          "open": len(wal.open_segments(cfg.wal_dir)), "quarantined": q.count, "last_error": q.last_error,
          "last_quarantined_at": q.last_at,
          "forgets_pending": sum(e.get("status") == "pending" for e in load_registry(lake))}
    if args.json:
        print(json.dumps(st))
        return 0
    print(f"wal dir  {st['wal_dir']}")
    print(f"sealed   {st['sealed']}")
    print(f"open     {st['open']}")
    print(f"quarantined {q.count} rows (in {lake.path(quarantine.ROOT)})")
    print(f"last error  {q.last_error or '-'}" + (f" (at {q.last_at})" if q.last_at else ""))
    print(f"forgets pending {st['forgets_pending']}")
    return 0
