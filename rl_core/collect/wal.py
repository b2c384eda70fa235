"""Write-ahead log: JSON-lines segments, fsynced with group commit before an event is acknowledged.

Why group commit: one fsync costs ~1-10 ms, so fsyncing each event caps ingestion at a few hundred
events/s. Appenders hand their line to one writer thread; it writes everything queued since its last
fsync, fsyncs once, and only then resolves every appender's future. An event is acknowledged only when
its bytes are on disk.

Segments: `<dir>/seg-<utc>-<pid>-<rand>.open` while written (the writer holds an exclusive flock on it,
taken before the file gets that name),
renamed to `.jsonl` ("sealed") when it rolls by size or age, or on close. A `.open` file whose flock can
be taken belongs to a dead writer (crash): the compactor seals it. A torn last line (crash mid-write) was
never acknowledged and is skipped by readers.
Each line: {"k": "interactions"|"feedback", "r": <row>}.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

OPEN_SUFFIX = ".open"
SEALED_SUFFIX = ".jsonl"
KINDS = ("interactions", "feedback")


def _json_default(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.astimezone(timezone.utc).isoformat()
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")


def encode(kind: str, row: dict[str, Any]) -> bytes:
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}")
    return (json.dumps({"k": kind, "r": row}, default=_json_default, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def read_segment(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(kind, row) for each complete line; a torn or garbled line (never acknowledged) is skipped."""
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break  # torn tail: the writer died mid-write, before the fsync that would have acked it
            try:
                obj = json.loads(line)
                yield obj["k"], obj["r"]
            except (ValueError, KeyError, TypeError):
                continue


def rewrite_segment(path: Path, keep: Callable[[str, Any], bool]) -> int:
    """Rewrite a SEALED segment without the rows `keep(kind, row)` refuses (`rtrl forget`; the caller holds
    the lake lock, so no compactor reads it meanwhile). Atomic: a hidden temp file, fsynced, renamed over
    it; a segment left empty is deleted. Torn or garbled lines (never acknowledged) go too. Returns the
    number of rows removed."""
    try:
        with open(path, "rb") as f:
            lines = f.readlines()
    except FileNotFoundError:  # compacted meanwhile
        return 0
    kept, removed = [], 0
    for line in lines:
        try:
            obj = json.loads(line) if line.endswith(b"\n") else None
            k, r = obj["k"], obj["r"]  # type: ignore[index]
        except (ValueError, KeyError, TypeError):
            continue  # torn or garbled: never acknowledged, not a row
        if keep(k, r):
            kept.append(line)
        else:
            removed += 1
    if removed == 0:  # nothing of the subject: the segment is left as it is
        return 0
    if kept:
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            _write_fd(fd, b"".join(kept))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    else:
        path.unlink()
    _fsync_dir(path.parent)
    return removed


def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def seal(path: Path) -> Path:
    """Rename an .open segment to .jsonl (durably). Returns the sealed path."""
    sealed = path.with_suffix(SEALED_SUFFIX)
    os.replace(path, sealed)
    _fsync_dir(path.parent)
    return sealed


def try_seal_orphan(path: Path) -> Path | None:
    """Seal an .open segment if no live writer holds its lock (its writer crashed); else None."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    try:
        return seal(path) if path.exists() else None
    finally:
        os.close(fd)


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class WalStats:
    appended: int = 0
    fsyncs: int = 0
    segments_sealed: int = 0


class WriteAheadLog:
    """Thread-safe appender. `append` blocks until durable; `submit` returns a Future for async callers."""

    def __init__(self, directory: str | Path, segment_max_bytes: int = 8 << 20, segment_max_age_s: float = 60.0):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = segment_max_bytes
        self.max_age = segment_max_age_s
        self.stats = WalStats()
        self._q: queue.Queue[tuple[bytes, Future] | None] = queue.Queue()
        self._fd: int | None = None
        self._path: Path | None = None
        self._size = 0
        self._opened_at = 0.0
        self._roll_requested = threading.Event()
        self._lock = threading.Lock()  # guards the segment (writer thread vs roll())
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="wal-writer", daemon=True)
        self._thread.start()

    # --- public ---------------------------------------------------------------------------------
    def submit(self, kind: str, row: dict[str, Any]) -> Future:
        fut: Future = Future()
        if self._closed:
            fut.set_exception(RuntimeError("write-ahead log is closed"))
            return fut
        self._q.put((encode(kind, row), fut))
        return fut

    def submit_many(self, items: list[tuple[str, dict[str, Any]]]) -> Future:
        """One future for a batch: written as one block, acknowledged together."""
        fut: Future = Future()
        if self._closed:
            fut.set_exception(RuntimeError("write-ahead log is closed"))
            return fut
        self._q.put((b"".join(encode(k, r) for k, r in items), fut))
        return fut

    def append(self, kind: str, row: dict[str, Any], timeout: float | None = 30.0) -> None:
        self.submit(kind, row).result(timeout)

    def roll(self) -> Path | None:
        """Seal the current segment now (e.g. before an on-demand compaction). Returns the sealed path."""
        with self._lock:
            return self._seal_current()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._q.put(None)
        self._thread.join(timeout=30)
        with self._lock:
            self._seal_current()

    @property
    def current_path(self) -> Path | None:
        return self._path

    # --- writer thread --------------------------------------------------------------------------
    def _open_segment(self) -> None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%f")
        path = self.dir / f"seg-{stamp}-{os.getpid()}-{uuid.uuid4().hex[:8]}{OPEN_SUFFIX}"
        # Locked under a hidden name first, then renamed (the lock follows the inode): a compactor never
        # sees an unlocked .open segment of a live writer, so it cannot seal one between create and flock.
        hidden = path.with_name(f".{path.name}.new")
        fd = os.open(hidden, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(hidden, path)
        _fsync_dir(self.dir)  # the segment's name is durable before anything in it is acknowledged
        self._fd, self._path, self._size, self._opened_at = fd, path, 0, time.monotonic()

    def _seal_current(self) -> Path | None:
        if self._fd is None or self._path is None:
            return None
        os.fsync(self._fd)
        sealed = seal(self._path)  # renamed while still locked: no compactor can take it for an orphan
        os.close(self._fd)
        self._fd, self._path = None, None
        self.stats.segments_sealed += 1
        return sealed

    def _run(self) -> None:
        stop = False
        while not stop:
            try:
                first = self._q.get(timeout=1.0)
            except queue.Empty:
                self._maybe_roll_by_age()
                continue
            batch = [first]
            while True:  # group commit: everything queued while the last fsync ran
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            if None in batch:
                stop = True
                batch = [b for b in batch if b is not None]
            if batch:
                self._commit(batch)  # type: ignore[arg-type]

    def _commit(self, batch: list[tuple[bytes, Future]]) -> None:
        data = b"".join(line for line, _ in batch)
        try:
            with self._lock:
                if self._fd is None:
                    self._open_segment()
                view = memoryview(data)
                while view:
                    n = os.write(self._fd, view)  # type: ignore[arg-type]
                    view = view[n:]
                os.fsync(self._fd)  # type: ignore[arg-type]
                self._size += len(data)
                self.stats.fsyncs += 1
                self.stats.appended += len(batch)
                if self._size >= self.max_bytes or time.monotonic() - self._opened_at >= self.max_age:
                    self._seal_current()
        except Exception as exc:  # disk full, I/O error: every waiting appender gets the error, no ack
            for _, fut in batch:
                fut.set_exception(exc)
            return
        for _, fut in batch:
            fut.set_result(None)

    def _maybe_roll_by_age(self) -> None:
        with self._lock:
            if self._fd is not None and time.monotonic() - self._opened_at >= self.max_age:
                self._seal_current()


def sealed_segments(directory: str | Path) -> list[Path]:
    d = Path(directory)
    return sorted(d.glob(f"seg-*{SEALED_SUFFIX}")) if d.is_dir() else []


def open_segments(directory: str | Path) -> list[Path]:
    d = Path(directory)
    return sorted(d.glob(f"seg-*{OPEN_SUFFIX}")) if d.is_dir() else []
