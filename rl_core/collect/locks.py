"""The lake's data-plane lock: compaction and `rtrl forget` serialize on it.

Both rewrite the same files (raw partitions, quarantine, forget/registry.json, forget/tombstones.json,
sealed WAL segments), so they take one exclusive lock for the whole of their work: a forget never runs
beside a compaction pass that has read rows but not yet written them, and two forgets never read-modify-
write the registry at once. An fcntl flock is held by an open file, so it is released when its holder
dies (a crash never leaves the lake locked) and two threads of one process exclude each other too (each
opens its own file). It is not re-entrant: code that already holds it calls the `*_locked` functions.

Where the lock lives: a local lake -> `<lake>/.rtrl-lake.lock` (hidden: no lake listing returns it).
A remote lake (s3://...) cannot hold a flock, so the lock is a local file under RTRL_HOME
(`locks/lake-<hash of the lake URL>.lock`): it serializes every process of that machine (gateway
compaction, `rtrl collect compact`, `rtrl forget`), not processes on other machines. A fleet that
compacts one s3 lake from several hosts runs forget and compaction from one host (or one Airflow pool
of size 1), or puts the lock in a shared store (e.g. a DynamoDB / PostgreSQL advisory lock).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

from rl_core.lake import Lake


class FileLock:
    """Exclusive flock on `path` for a `with` block (the file is created 0600 if missing)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.fd: int | None = None

    def __enter__(self) -> FileLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def lake_lock_path(lake: Lake) -> Path:
    if lake.is_local:
        return Path(lake.base) / ".rtrl-lake.lock"
    from rl_core.config import load_config  # the home of this machine's config (RTRL_HOME wins)

    digest = hashlib.sha256(lake.root.encode()).hexdigest()[:16]
    return load_config().home_path / "locks" / f"lake-{digest}.lock"


def lake_lock(lake: Lake) -> FileLock:
    """The one lock compaction and forget share (see the module doc for what it covers on s3)."""
    return FileLock(lake_lock_path(lake))
