"""Deploy: the only code path that sets the `challenger` alias (through rl_core.registry.promote).

A version becomes the challenger only when the promotion gate passes for the run that produced it,
and only if that version really is the run's checkpoint (its run_id tag), so no verdict of one run can
carry another model. The serving gateway's auto router then sends it serving.challenger_share of
traffic (by a stable hash of user_id) within one alias poll interval.

Nor while an alias has drifted (moved outside rtrl, rl_core/registry/drift.py): the promotion verdict then fails
with the drift as its reason, which the cycle's outcome line shows. A refusal's reasons go into the version's
History (and the promotion verdict in the lake), not into a tag, so the version's row stays short.
"""

from __future__ import annotations

from rl_core.config import Config
from rl_core.lake import Lake
from rl_core.registry import drift, gate, promote, store
from rl_core.reports import Verdict, write_verdict


def deploy(cfg: Config, run_id: str, version: int) -> bool:
    """Gate, then alias `challenger` -> version. Returns True when the alias moved; False otherwise."""
    from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

    verdict = gate.decide(cfg, run_id)
    c = store.client(cfg)
    name = cfg.mlflow.model_name
    extra: list[str] = []
    try:
        mv = c.get_model_version(name, str(version))
    except MlflowException:
        extra.append(f"version {version} of {name} does not exist")
        mv = None
    if mv is not None:
        tagged = (mv.tags or {}).get("run_id")
        if tagged != run_id:
            extra.append(f"version {version} was registered for run {tagged!r}, not {run_id!r}")
        if store.version_for_alias(cfg, "champion") == int(version):
            extra.append(f"version {version} is already the champion")
    if drifts := drift.check(cfg):
        extra.append(str(drift.AliasDrift("deploy", drifts)))
    if extra:
        verdict = Verdict(name=verdict.name, passed=False, reasons=verdict.reasons + extra, details=verdict.details)
        write_verdict(Lake(cfg.lake_root), run_id, verdict)
    if mv is not None:
        c.set_model_version_tag(name, str(version), "promotion", "passed" if verdict.passed else "refused")
        if not verdict.passed:
            store.append_history(cfg, int(version), f"promotion refused: {'; '.join(verdict.reasons)}"[:4000], once=True)
    if not verdict.passed:
        return False
    promote.point(cfg, "challenger", int(version), f"deploy {run_id}: every gate passed")
    return True
