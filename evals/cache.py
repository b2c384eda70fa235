"""The baseline's eval results, kept for the next cycle that compares against the same version.

Every cycle runs the suite twice: on its candidate and on the version the candidate was trained from.
That version is usually the champion of the previous cycle too, so its half of the eval is the same
work again: same weights, same tasks, same budget, and greedy decoding, so the same answers. The cache
keeps one suite run per key in the lake (`evals/cache/<key>.parquet`) and hands it back instead.

The key is everything that decides the results: the checkpoint's content (every file but the trainer's
done-mark, which only records where it came from), the tasks' full content, the budget (sampling seed and
samples included), the engine, the dtype, and the source of the code that runs an episode and scores it. The
content, not the version number: a candidate's own run is found again when the registered copy of the same
weights is the next cycle's baseline (the experiment trains from the latest version, so that is every cycle),
and a rerun of a failed eval task reuses what already ran. A change to any input is a new key, so a stale
entry is never read; it is only left behind. Hashing costs ~0.5 s for SmolLM2-135M's 540 MB (sha256 at
~1.4 GB/s on this 2-core EPYC), against a suite run of minutes. A sampled eval is cached too: every request
is seeded from the budget's seed, so its result is a draw under those seeds (an engine batching requests
differently may break a floating-point tie another way; the cached draw is still a draw of these weights).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pyarrow as pa

from evals.harness import Budget, TaskResult
from evals.tasks import Task
from rl_core.models import DONE_MARK

FOLDER = "evals/cache"
# the code whose change changes a result: the episode loop, tools, sandbox, prompt format, model loading
_CODE = ("evals/harness.py", "evals/tools.py", "evals/sandbox.py", "evals/_jail.py", "evals/_serve.py", "evals/_wire.py",
         "evals/_judge.py", "evals/judge.py", "evals/cgroup.py", "evals/policies.py", "rl_core/toolcalls.py", "rl_core/models.py")
_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Cached:
    """A suite run read back from the cache: compare_policies uses it in place of a Policy (either side)."""

    key: str
    name: str
    results: list[TaskResult]


def _file_digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def key(checkpoint: str | Path, dtype: str, tasks: list[Task], budget: Budget, engine: str = "") -> str:
    """The cache key of one checkpoint's suite run on one engine kind."""
    ckpt = Path(checkpoint)
    files = sorted(p for p in ckpt.rglob("*")
                   if p.is_file() and p.name != DONE_MARK and not p.name.startswith("."))
    payload = {
        "dtype": dtype,
        "engine": engine,
        "checkpoint": {str(p.relative_to(ckpt)): _file_digest(p) for p in files},
        "tasks": [t.model_dump(mode="json") for t in tasks],
        "budget": asdict(budget),
        "code": {c: hashlib.sha256((_ROOT / c).read_bytes()).hexdigest() for c in _CODE if (_ROOT / c).is_file()},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:32]


def load(lake, cache_key: str, name: str) -> Cached | None:
    """The cached run for this key, or None if there is none (or it lacks a column). The results take
    `name` as their policy: the same weights may have run as "candidate:..." and come back as a version."""
    if not cache_key or not lake.exists(f"{FOLDER}/{cache_key}.parquet"):
        return None
    table = lake.read_parquet(f"{FOLDER}/{cache_key}.parquet")
    names = [f.name for f in fields(TaskResult)]
    if not set(names) <= set(table.column_names):
        return None
    rows = table.select(names).to_pylist()
    return Cached(cache_key, name, [TaskResult(**{**r, "policy": name}) for r in rows])


def save(lake, cache_key: str, results: list[TaskResult]) -> str | None:
    """Keep one suite run under its key (an atomic write: a reader sees the whole file or none). A run in
    which the policy failed (an error) or a test hit its time limit is not kept: either may be the
    machine's state that day (load, memory) rather than the weights', and a cache would repeat it forever."""
    if any(r.error or r.test_status == "timeout" for r in results):
        return None
    table = pa.Table.from_pylist([asdict(r) for r in results])
    return lake.write_parquet(f"{FOLDER}/{cache_key}.parquet", table)
