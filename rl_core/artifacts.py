"""Typed run artifacts: what a stage writes into runs/<run_id>/ and a later stage reads back, declared once.

They live below the stages (the standard library only), so rl_core.lake can hand them back typed
(Lake.read_harvest) without importing the stage that writes them: the harvest module imports DuckDB, and
every stage imports the lake. A reader gets attributes and the artifact's own methods (skip_reason) instead
of `.get("key")` on a dict, so a renamed field fails where it is read, not as a silent None.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any


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
