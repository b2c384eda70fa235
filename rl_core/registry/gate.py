"""The promotion gate: one function that reads every verdict of a cycle and says pass or fail, with why.

It is the only input to an alias move for a new checkpoint (deploy calls it itself and never trusts a
verdict handed to it). A verdict that is missing counts as failed: a stage that crashed before writing
one must never look like a stage that passed. On top of the trainer's own verdict the gate re-checks
the numbers it can see (finite loss, KL within gates.kl_max), so a trainer that wrote "passed" next to
a NaN loss still cannot ship.
"""

from __future__ import annotations

import math

from rl_core.config import Config
from rl_core.lake import Lake
from rl_core.reports import GateFailed, Verdict, read_verdicts, write_verdict
from rl_core.stages import REQUIRED_VERDICTS

NAME = "promotion"
LOSS_KEYS = ("loss", "final_loss", "mean_loss")
KL_KEYS = ("kl", "mean_kl", "kl_mean", "approx_kl", "max_kl")


def _train_numbers(v: Verdict, kl_max: float) -> list[str]:
    """Sanity of the trainer's numbers, wherever the train verdict's details report them."""
    reasons = []
    details = dict(v.details)
    if isinstance(v.details.get("metrics"), dict):
        details.update(v.details["metrics"])
    for key in (k for k in LOSS_KEYS + KL_KEYS if k in details):
        x = details[key]
        # JSON has no NaN: a NaN written by pydantic comes back as null, so null counts as not finite
        if not _finite(x):
            reasons.append(f"train: {key} = {x!r} is not a finite number")
        elif key in KL_KEYS and x > kl_max:
            reasons.append(f"train: {key} = {x} exceeds gates.kl_max = {kl_max}")
    return reasons


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def evaluate(cfg: Config, run_id: str, verdicts: dict[str, Verdict]) -> Verdict:
    """The promotion verdict from a run's verdicts (pure: no reads, no writes)."""
    reasons: list[str] = []
    status: dict[str, str] = {}
    for name in REQUIRED_VERDICTS:
        v = verdicts.get(name)
        if v is None:
            status[name] = "missing"
            reasons.append(f"{name}: verdict missing (the stage did not run or did not finish)")
            continue
        status[name] = "passed" if v.passed else "failed"
        if not v.passed:
            why = "; ".join(v.reasons) or "failed without a reason"
            reasons.append(f"{name}: {why}")
        if name == "train":
            extra = _train_numbers(v, cfg.gates.kl_max)
            if extra:
                status[name] = "failed"
                reasons.extend(extra)
    return Verdict(name=NAME, passed=not reasons, reasons=reasons, details={"run_id": run_id, "verdicts": status})


def decide(cfg: Config, run_id: str, raise_on_fail: bool = False) -> Verdict:
    """Read runs/<run_id>/verdicts/*, decide, write the "promotion" verdict; GateFailed if asked and failing."""
    lake = Lake(cfg.lake_root)
    verdict = evaluate(cfg, run_id, read_verdicts(lake, run_id))
    write_verdict(lake, run_id, verdict)
    if raise_on_fail and not verdict.passed:
        raise GateFailed(verdict)
    return verdict
