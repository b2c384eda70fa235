"""Typed run artifacts: what a stage writes into runs/<run_id>/ and a later stage reads back, declared once.

They live below the stages (the standard library and pydantic only), so rl_core.lake can hand them back typed
(Lake.read_harvest, Lake.read_train_summary) without importing the stage that writes them: the harvest module imports DuckDB, and
every stage imports the lake. A reader gets attributes and the artifact's own methods (skip_reason) instead
of `.get("key")` on a dict, so a renamed field fails where it is read, not as a silent None.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from pydantic import BaseModel, field_validator


@dataclass
class HarvestResult:
    """What one harvest did: its window, policy version and counts (rl_core.harvest returns it and writes it
    into runs/<run_id>/harvest.json; the DAG passes mapped parts' results as dicts of it)."""

    run_id: str
    path: str
    start: str
    end: str
    policy_version: int
    granularity: str
    n_interactions: int  # in the window, any version
    n_episodes: int
    n_stale: int  # in the window but outside [policy_version - max_staleness, policy_version]
    n_with_feedback: int
    n_interaction_files: int
    n_feedback_files: int
    n_excluded: int = 0  # in the window but opted out or forgotten (data rights)
    org_id: str | None = None  # set for a per-organisation harvest
    n_consumed: int = 0  # in the window and the version bound, but already trained on in the lineage (ledger)
    lineage: str | None = None  # the ledger's lineage the harvest consulted (None: none)
    consumed_by: list[dict] = field(default_factory=list)  # [{run_id, version, n}]: who consumed them

    def skip_reason(self) -> str | None:
        """Why this window has nothing to train on, when that is not a data defect: no traffic at all, or
        only episodes the lineage already trained on. None when there are episodes, or when the window's
        traffic is all stale or excluded (the gates then say what is wrong with it)."""
        window = f"[{self.start}, {self.end})"
        if self.n_interactions == 0:
            return f"no traffic in {window}: the lake has no interaction in this window, nothing to train on"
        if self.n_episodes == 0 and self.n_consumed:
            runs = ", ".join(f"run {c['run_id']} (v{c['version']}, {c['n']})" for c in self.consumed_by)
            return (f"nothing new in {window}: all {self.n_consumed} episodes of policy v{self.policy_version} "
                    f"were already trained on in lineage {self.lineage} by {runs or 'earlier runs'}")
        return None

    @classmethod
    def from_manifest(cls, manifest: Any, where: str = "harvest manifest") -> HarvestResult:
        """The result in runs/<run_id>/harvest.json, which holds more: the settings the harvest ran under and
        what `rtrl exclude` dropped later (rl_core.harvest, rl_core.exclude) are the file's, not the result's.
        A file without a field the result requires (another release's) is a ValueError naming it."""
        if not isinstance(manifest, dict):
            raise ValueError(f"{where}: not a JSON object")
        known = fields(cls)
        missing = [f.name for f in known
                   if f.name not in manifest and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise ValueError(f"{where}: lacks {', '.join(missing)}, so it is not a harvest's manifest")
        return cls(**{f.name: manifest[f.name] for f in known if f.name in manifest})


class TrainSummary(BaseModel):
    """What `rtrl train` did (runs/<run_id>/train/summary.json): rl_core.train.launch writes it, the train
    verdict, the registry and the org path read it back as this type, never as a dict."""

    run_id: str
    status: str  # "ok" | "failed"
    exit_code: int
    base_version: int
    steps: int = 0
    # metrics are None when unknown or not finite (JSON has no NaN); the verdict treats None as failing
    loss: float | None = None  # mean over steps
    kl: float | None = None  # mean over steps (exact over the vocabulary, to the parent)
    kl_max: float | None = None  # largest per-step KL: what the verdict checks
    clip_frac: float | None = None
    is_weight_mean: float | None = None
    is_weight_max: float | None = None
    entropy: float | None = None
    grad_norm: float | None = None  # mean over steps, before clipping
    tokens_per_s: float | None = None  # prompt + completion tokens, all ranks, per second of training
    episodes: int = 0
    truncated: int = 0
    checkpoint: str = ""
    adapter: str | None = None
    mlflow_run_id: str = ""
    launcher: str = ""
    num_procs: int = 1
    world_size: int = 0  # ranks that actually trained (all nodes)
    zero_stage: int = 0
    precision: str = ""
    resumed_from_step: int = 0
    elapsed_s: float = 0.0
    inputs_hash: str = ""
    data: dict = {}
    log_tail: str = ""

    @field_validator("loss", "kl", "kl_max", "clip_frac", "is_weight_mean", "is_weight_max", "entropy", "grad_norm",
                     "tokens_per_s", mode="before")
    @classmethod
    def _finite_or_none(cls, v):
        return v if v is None or math.isfinite(float(v)) else None
