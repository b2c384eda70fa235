"""Lake: partition paths, window listing, and atomic writes on a local folder and on memory://."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from rl_core.lake import Lake

T0 = datetime(2026, 12, 2, 10, 30, tzinfo=timezone.utc)


@pytest.fixture(params=["local", "memory"])
def lake(request, tmp_path):
    if request.param == "local":
        return Lake(str(tmp_path / "lake"))
    return Lake(f"memory://lake-{uuid.uuid4().hex}")


def test_partition_path():
    assert Lake.partition("interactions", T0) == "raw/interactions/date=2026-12-02/hour=10"
    naive = datetime(2026, 12, 2, 23, 59)
    assert Lake.partition("feedback", naive) == "raw/feedback/date=2026-12-02/hour=23"


def test_write_list_and_read_window(lake):
    t = pa.table({"x": [1, 2]})
    for h in range(5):
        lake.write_partition("interactions", T0 + timedelta(hours=h), t)
    # [10:30, 13:00) overlaps hours 10, 11, 12
    files = lake.list_window("interactions", T0, T0.replace(minute=0) + timedelta(hours=3))
    assert len(files) == 3
    assert lake.read_window("interactions", T0, T0 + timedelta(hours=1)).num_rows == 4
    assert lake.read_window("feedback", T0, T0 + timedelta(hours=1)) is None
    with pytest.raises(ValueError):
        lake.list_window("nope", T0, T0)


def test_json_and_run_files(lake):
    lake.write_json(lake.run("r1").file("report.json"), {"a": 1})
    assert lake.read_json("runs/r1/report.json") == {"a": 1}
    lake.write_parquet("runs/r1/episodes.parquet", pa.table({"e": ["x"]}))
    assert lake.read_parquet("runs/r1/episodes.parquet").num_rows == 1
    for bad in ("", "../x", "a/b", ".hidden"):
        with pytest.raises(ValueError):
            lake.run(bad)


def test_hidden_and_temp_files_are_never_listed(lake):
    part = Lake.partition("interactions", T0)
    lake.write_partition("interactions", T0, pa.table({"x": [1]}))
    with lake.fs.open(lake.path(part, ".tmp-abc-part.parquet"), "wb") as f:
        f.write(b"partial")
    with lake.fs.open(lake.path(part, "_SUCCESS.parquet"), "wb") as f:
        f.write(b"")
    assert len(lake.list_files(part)) == 1


CRASH = r"""
import os, sys
import pyarrow as pa
from rl_core import lake as L
real_replace = os.replace
def crash(*a, **k):
    os._exit(9)   # the process dies after writing + fsync, before the rename
os.replace = crash
L.Lake(sys.argv[1]).write_parquet("raw/interactions/date=2026-12-02/hour=10/p.parquet", pa.table({"x": list(range(1000))}))
"""


def test_crash_mid_write_leaves_no_visible_file(tmp_path):
    root = tmp_path / "lake"
    r = subprocess.run([sys.executable, "-c", CRASH, str(root)], capture_output=True, text=True)
    assert r.returncode == 9, r.stderr
    lake = Lake(str(root))
    assert lake.list_files("raw") == []
    leftovers = os.listdir(root / "raw/interactions/date=2026-12-02/hour=10")
    assert leftovers and all(n.startswith(".tmp-") for n in leftovers)


def test_overwrite_is_atomic_replace(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    lake.write_parquet("runs/r/e.parquet", pa.table({"x": [1]}))
    lake.write_parquet("runs/r/e.parquet", pa.table({"x": [1, 2, 3]}))
    assert lake.read_parquet("runs/r/e.parquet").num_rows == 3
    assert os.listdir(tmp_path / "lake/runs/r") == ["e.parquet"]
