"""Verdicts: how the stages of a cycle tell the promotion gate what they found.

Every check of a cycle (data-quality gates, reward-hacking monitors, trainer sanity, the eval paired
comparison) writes one `Verdict` as JSON to runs/<run_id>/verdicts/<name>.json in the lake. The promotion
gate (rl_core.registry.gate) reads all of them; a missing or failing one blocks any alias move.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from rl_core.lake import Lake
from rl_core.schema import now_utc

# The verdicts a full cycle must produce before its checkpoint may become the challenger.


class Verdict(BaseModel):
    name: str
    passed: bool
    reasons: list[str] = []  # one readable line per failed check (empty when passed)
    details: dict[str, Any] = {}
    ts: datetime = Field(default_factory=now_utc)


class GateFailed(RuntimeError):
    """A gate refused the cycle's data or model; the message lists every failed check."""

    def __init__(self, verdict: Verdict):
        self.verdict = verdict
        super().__init__(f"{verdict.name} failed:\n  - " + "\n  - ".join(verdict.reasons or ["(no reason given)"]))


def verdict_path(lake: Lake, run_id: str, name: str) -> str:
    return lake.run(run_id).verdict(name)


def write_verdict(lake: Lake, run_id: str, verdict: Verdict) -> str:
    return lake.write_json(verdict_path(lake, run_id, verdict.name), verdict.model_dump(mode="json"))


def read_verdict(lake: Lake, run_id: str, name: str) -> Verdict | None:
    path = verdict_path(lake, run_id, name)
    if not lake.exists(path):
        return None
    return Verdict.model_validate(lake.read_json(path))


def read_verdicts(lake: Lake, run_id: str) -> dict[str, Verdict]:
    folder = lake.run(run_id).verdicts
    out: dict[str, Verdict] = {}
    if not lake.exists(folder):
        return out
    for p in sorted(lake.fs.ls(lake.path(folder), detail=False)):
        name = p.rsplit("/", 1)[-1]
        if name.endswith(".json") and not name.startswith("."):
            v = read_verdict(lake, run_id, name[:-5])
            if v is not None:
                out[v.name] = v
    return out
