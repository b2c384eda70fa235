"""The data lake: partition paths, atomic Parquet writes and window listing over any fsspec filesystem.

Layout (design.md): raw/<table>/date=YYYY-MM-DD/hour=HH/*.parquet for events, runs/<run_id>/ for a
cycle's outputs. A write lands under a hidden temporary name ('.tmp-...'), is flushed and fsynced
(local disk), then renamed into place, so a reader never sees a partial file: listings skip names that
start with '.' or '_'.
"""

from __future__ import annotations

import io
import json
import os
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from rl_core.artifacts import HarvestResult, TrainSummary
from rl_core.config import Config
from rl_core.ids import check_run_id

RAW_TABLES = ("interactions", "feedback")

# Reads from an S3 lake are plain ranged GETs, without s3fs's read-ahead cache (its default: every read also
# fetches the next 50 MB block and each open file keeps it). DuckDB and pyarrow already ask for whole column
# chunks; the read-ahead blocks were Python buffers outside DuckDB's memory_limit, and the harvest of a window
# from S3 peaked ~0.6 GiB above the same harvest from local disk (bench/harvest_scale.py, docs/benchmarks.md).
REMOTE_READ_OPTIONS: dict[str, dict[str, Any]] = {"s3": {"default_cache_type": "none"},
                                                  "s3a": {"default_cache_type": "none"}}


@dataclass(frozen=True)
class RunDir:
    """One run's folder in the lake, runs/<run_id>/: every stage's files by name, spelled here once.

    episodes.parquet (harvest), harvest.json (its manifest), parts/ (a harvest mapped over parts of the
    window), rewards.parquet (rewards), quality/ (the GX reports), monitors.json, train/summary.json (the
    trainer), eval/ (the paired eval), eval_org/ (an org's tasks), verdicts/<name>.json (every check),
    adapter.json (an org adapter's registration)."""

    run_id: str

    def __post_init__(self) -> None:
        check_run_id(self.run_id)  # the one rule (rl_core/ids.py): a plain name of at most MAX_ID characters

    @property
    def root(self) -> str:
        return f"runs/{self.run_id}"

    def file(self, name: str) -> str:
        return f"{self.root}/{name}"

    episodes = property(lambda self: self.file("episodes.parquet"))
    rewards = property(lambda self: self.file("rewards.parquet"))
    manifest = property(lambda self: self.file("harvest.json"))
    monitors = property(lambda self: self.file("monitors.json"))
    train_summary = property(lambda self: self.file("train/summary.json"))
    eval = property(lambda self: self.file("eval"))
    eval_org = property(lambda self: self.file("eval_org"))
    verdicts = property(lambda self: self.file("verdicts"))
    adapter = property(lambda self: self.file("adapter.json"))

    def part(self, start: datetime) -> str:
        """One mapped harvest task's episodes: the part of the window that starts at `start`."""
        return self.file(f"parts/{start.astimezone(timezone.utc):%Y%m%dT%H%M%S}.parquet")

    def verdict(self, name: str) -> str:
        return f"{self.verdicts}/{name}.json"

    def quality(self, name: str) -> str:
        return self.file(f"quality/{name}.json")


def _hour_floor(ts: datetime) -> datetime:
    ts = ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts.astimezone(timezone.utc)
    return ts.replace(minute=0, second=0, microsecond=0)


@dataclass
class Lake:
    root: str  # a local folder or an fsspec URL

    def __post_init__(self) -> None:
        protocol, _ = fsspec.core.split_protocol(self.root)
        self.fs, self.base = fsspec.core.url_to_fs(self.root, **REMOTE_READ_OPTIONS.get(protocol or "", {}))
        self.is_local = self.fs.protocol in ("file", "local") or "file" in (self.fs.protocol or ())
        if self.is_local:
            os.makedirs(self.base, exist_ok=True)

    # --- paths ------------------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return "/".join([self.base.rstrip("/"), *parts])

    def url(self, *parts: str) -> str:
        """A path with the filesystem's protocol, for readers outside fsspec (DuckDB, MLflow)."""
        p = self.path(*parts)
        return p if self.is_local else self.fs.unstrip_protocol(p)

    @staticmethod
    def partition(table: str, ts: datetime) -> str:
        ts = _hour_floor(ts)
        return f"raw/{table}/date={ts:%Y-%m-%d}/hour={ts:%H}"

    @staticmethod
    def run(run_id: str) -> RunDir:
        """The run's folder layout (the run id validated: rl_core.ids.check_run_id, else IdError)."""
        return RunDir(run_id)

    # --- writes -----------------------------------------------------------------------------------
    def write_bytes(self, relpath: str, data: bytes) -> str:
        """Write atomically: hidden temp file, flush + fsync, rename. Returns the final path."""
        final = self.path(relpath)
        parent, name = final.rsplit("/", 1)
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}-{name}"
        self.fs.makedirs(parent, exist_ok=True)
        if self.is_local:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
        else:
            with self.fs.open(tmp, "wb") as f:
                f.write(data)
        self.publish(tmp, final)
        return final

    def publish(self, tmp: str, final: str) -> None:
        """Move a fully written temp file into place: on local disk fsync it, rename, fsync the folder (the
        rename itself is durable); on a remote filesystem one move."""
        if not self.is_local:
            self.fs.mv(tmp, final)
            return
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        dfd = os.open(final.rsplit("/", 1)[0], os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def write_parquet(self, relpath: str, table: pa.Table) -> str:
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        return self.write_bytes(relpath, buf.getvalue())

    def write_json(self, relpath: str, obj: Any) -> str:
        return self.write_bytes(relpath, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())

    def write_partition(self, table_name: str, ts: datetime, table: pa.Table, name: str | None = None) -> str:
        name = name or f"part-{uuid.uuid4().hex}.parquet"
        return self.write_parquet(f"{self.partition(table_name, ts)}/{name}", table)

    # --- reads ------------------------------------------------------------------------------------
    def exists(self, relpath: str) -> bool:
        return self.fs.exists(self.path(relpath))

    def read_parquet(self, relpath: str) -> pa.Table:
        with self.fs.open(self.path(relpath), "rb") as f:
            return pq.read_table(f)

    def read_json(self, relpath: str) -> Any:
        with self.fs.open(self.path(relpath), "rb") as f:
            return json.loads(f.read())

    def read_harvest(self, run_id: str) -> HarvestResult | None:
        """The run's harvest.json as the HarvestResult the harvest wrote, or None before a harvest ran; a file
        that is not one is a ValueError naming it (rl_core.artifacts: the type lives below the stages)."""
        path = self.run(run_id).manifest
        return HarvestResult.from_manifest(self.read_json(path), path) if self.exists(path) else None

    def read_train_summary(self, run_id: str) -> TrainSummary | None:
        """The run's train/summary.json as the TrainSummary `rtrl train` wrote, or None before training ran; a
        file that is not one is a pydantic ValidationError naming the field."""
        path = self.run(run_id).train_summary
        return TrainSummary.model_validate(self.read_json(path)) if self.exists(path) else None

    def list_files(self, relpath: str) -> list[str]:
        """Visible Parquet files below relpath (recursive), sorted; temp and hidden files skipped."""
        root = self.path(relpath)
        if not self.fs.exists(root):
            return []
        out = []
        for p in self.fs.find(root):
            if not p.endswith(".parquet"):
                continue
            if any(seg.startswith((".", "_")) for seg in p[len(root):].split("/")):
                continue
            out.append(p)
        return sorted(out)

    def hours(self, start: datetime, end: datetime) -> list[datetime]:
        """Hour partitions overlapping [start, end)."""
        h, stop = _hour_floor(start), end.astimezone(timezone.utc) if end.tzinfo else end.replace(tzinfo=timezone.utc)
        out = []
        while h < stop:
            out.append(h)
            h += timedelta(hours=1)
        return out

    def list_window(self, table: str, start: datetime, end: datetime) -> list[str]:
        """Parquet files of a raw table whose hour partition overlaps [start, end)."""
        if table not in RAW_TABLES:
            raise ValueError(f"unknown raw table {table!r}")
        files: list[str] = []
        for h in self.hours(start, end):
            files.extend(self.list_files(self.partition(table, h)))
        return files

    def read_window(self, table: str, start: datetime, end: datetime) -> pa.Table | None:
        files = self.list_window(table, start, end)
        if not files:
            return None
        return pa.concat_tables([pq.read_table(self.fs.open(p, "rb")) for p in files], promote_options="default")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def lake_from_config(cfg: Config) -> Lake:
    return Lake(cfg.lake_root)
