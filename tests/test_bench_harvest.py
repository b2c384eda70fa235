"""bench/harvest_rewards.py runs end to end on a small window: its pandas baseline computes the same rewards
as rtrl (so its speed-up compares like with like) and it prints the throughput and I/O-floor tables."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_harvest_bench_prints_its_tables_and_pandas_matches_rtrl(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench/harvest_rewards.py"), "--n", "3000", "--pandas-n", "2000", "--repeat", "1"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert re.search(r"\| rtrl: DuckDB \+ Arrow scorers \| 3,000 \|", text), text
    assert re.search(r"\| plain pandas \(baseline\) \| 2,000 \|", text), text
    diff = float(re.search(r"max \|reward difference\| rtrl vs pandas: (\S+);", text).group(1))
    assert diff < 1e-9, text
    assert "| **floor total** |" in text and "write the episodes (uncompressed)" in text, text
    assert re.search(r"precision", text, re.I), text  # the follow-up classifier's table
