"""DuckDB over the lake, and atomic Parquet writes: the helpers every stage that reads or writes run files uses.

One place for them: harvest, rewards, quality gates, monitors, the ledger and the A/B analysis all read the
lake through `connect` (the same settings everywhere, see the NaN note inside) and `bind_files`, and load
their SQL with `load_sql` (every statement lives in sql/, one file per query).
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rl_core.config import REPO_ROOT
from rl_core.lake import Lake
from rl_core.schema import BAD_LOGPROBS_SQL

SQL_DIR = REPO_ROOT / "sql"


def load_sql(name: str) -> str:
    """The text of sql/<name> (every statement lives in sql/, one file per query)."""
    path = SQL_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"no SQL file {path}")
    return path.read_text()


def connect(lake: Lake, threads: int | None = None, memory_limit: str | None = None):
    """A DuckDB connection that can read the lake (fsspec filesystems registered for remote lakes).
    memory_limit: config harvest.duckdb_memory_limit (None: DuckDB's default, 80% of RAM)."""
    import duckdb

    # big sorts spill here (per process: concurrent processes must not share DuckDB's temp file names)
    spill = os.path.join(tempfile.gettempdir(), f"rtrl-duckdb-{os.getpid()}")
    con = duckdb.connect(config={"temp_directory": spill})
    # DuckDB 2.0.1 folds isnan(x) / x < 1e308 to constants from Parquet column statistics, which leave NaN
    # out (pyarrow writes min/max without NaN), so NaN rows would read as clean. Measured; keep this off,
    # and never filter on isnan() in a WHERE clause (row-group pruning has the same blind spot).
    con.execute("SET disabled_optimizers = 'statistics_propagation'")
    con.execute(BAD_LOGPROBS_SQL)  # bad_logprobs(list): the contract's logprob rule, for every query in sql/
    if not lake.is_local:
        # One thread on a remote lake: DuckDB reads a Python (fsspec) file as seek() then read(), each call under
        # the GIL on its own, and its threads share a file's handle, so two threads reading one file can read
        # each other's bytes (seen: "ZSTD Decompression failure" from S3, and pyarrow's S3 behind fsspec failing
        # with "Invalid data"). Sharing one handle is only safe one thread at a time.
        threads = 1
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    if memory_limit:
        con.execute(f"SET memory_limit = '{memory_limit}'")
    if not lake.is_local:
        con.register_filesystem(lake.fs)
    return con


def file_urls(lake: Lake, paths: list[str]) -> list[str]:
    return list(paths) if lake.is_local else [lake.fs.unstrip_protocol(p) for p in paths]


def bind_files(con, lake: Lake, view: str, paths: list[str], schema: pa.Schema, located: bool = False) -> None:
    """Create view `view` over Parquet files (or an empty table of `schema` when there are none).
    located: each row also carries its place in the lake (DuckDB's `filename` and `file_row_number`)."""
    if paths:
        con.read_parquet(file_urls(lake, paths), union_by_name=True, filename=located,
                         file_row_number=located).create_view(view, replace=True)
        return
    empty = schema.empty_table()
    if located:
        empty = empty.append_column("filename", pa.array([], pa.string()))
        empty = empty.append_column("file_row_number", pa.array([], pa.int64()))
    con.register(view, empty)


def write_table(lake: Lake, relpath: str, table: pa.Table) -> str:
    """Atomic Parquet write (Lake.write_bytes) with dictionary encoding for string columns only: token-id lists
    are near-random, a dictionary attempt on them costs a third of the write time and saves nothing."""
    buf = io.BytesIO()
    strings = [f.name for f in table.schema if pa.types.is_string(f.type)]
    pq.write_table(table, buf, compression="zstd", use_dictionary=strings)
    return lake.write_bytes(relpath, buf.getvalue())


def write_stream(lake: Lake, relpath: str, reader, schema: pa.Schema) -> tuple[str, int, int]:
    """Stream record batches into one Parquet file, atomically (hidden temp name, fsync, rename), so a
    million episodes never sit in Python memory at once. Returns (path, rows, rows with n_feedback > 0)."""
    final = lake.path(relpath)
    parent, name = final.rsplit("/", 1)
    tmp = f"{parent}/.tmp-{uuid.uuid4().hex}-{name}"
    lake.fs.makedirs(parent, exist_ok=True)
    strings = [f.name for f in schema if pa.types.is_string(f.type)]
    n_rows = n_fb = 0
    try:
        # a local lake gets Arrow's native file output (a Python file object costs a call per 256 KB page)
        with (contextlib.nullcontext(tmp) if lake.is_local else lake.fs.open(tmp, "wb")) as f:
            with pq.ParquetWriter(f, schema, compression="zstd", use_dictionary=strings) as writer:
                for batch in reader:
                    t = pa.Table.from_batches([batch]).select(schema.names).cast(schema)
                    writer.write_table(t)
                    n_rows += t.num_rows
                    if "n_feedback" in schema.names:
                        n_fb += int(pc.sum(pc.greater(t["n_feedback"], 0)).as_py() or 0)
                if n_rows == 0:
                    writer.write_table(schema.empty_table())
        lake.publish(tmp, final)
    finally:
        if lake.fs.exists(tmp):
            lake.fs.rm(tmp)
    return final, n_rows, n_fb
