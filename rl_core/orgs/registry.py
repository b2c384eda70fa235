"""Org adapters in MLflow: one registered model per organisation, `rtrl-adapter-<org>`, adapter folders as versions.

Why a model per org rather than tags on `rtrl-policy`: an adapter is not a policy (it needs its base), its
versions count that org's updates only, aliases (`live`) are per org, and deleting an org's models is one
call when it leaves. Each version carries the lineage of the cycle's versions (parent_version = the base
policy version it was trained on, data_window, run_id, episodes, reward_config_hash, verdict.*) plus
kind=org_adapter, org_id, base_model and adapter_version: the name serving loads it under,
`<org>-v<version>-<sha8 of the weights>`. MLflow can hand out a version number again after the newest
version is deleted; the weights hash in the name keeps a name from ever meaning two different adapters
(vLLM caches adapters by name: a reused name would serve stale weights).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from rl_core.config import Config
from rl_core.ids import check_org_id
from rl_core.lake import Lake
from rl_core.orgs.pipeline import OrgRun, check_org
from rl_core.registry import promote, register, store
from rl_core.registry.adapters import (  # noqa: F401 (the org side's names, re-exported)
    ADAPTER_PREFIX,
    LIVE_ALIAS,
    AdapterVersion,
    adapter_model_name,
    adapter_registry,
    live_adapter,
    newest_adapter,
)
from rl_core.reports import read_verdicts
from rl_core.stages import ADAPTER_VERDICTS


def weights_digest(adapter_dir: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(adapter_dir.glob("*.safetensors")) or sorted(adapter_dir.glob("*.bin")):
        h.update(f.read_bytes())
    return h.hexdigest()[:8]


def register_adapter(cfg: Config, o: OrgRun) -> AdapterVersion:
    """Register the org run's adapter folder (the same run twice returns its existing version)."""
    orun, org_id = o.run_id, o.org_id
    areg = adapter_registry(cfg, org_id)
    lake = Lake(cfg.lake_root)
    summary = lake.read_train_summary(orun)
    adapter = Path((summary.adapter if summary else None) or cfg.models_dir / "runs" / orun / "adapter")
    if not (adapter / "adapter_config.json").is_file():
        raise register.RegisterError(f"{adapter}: no adapter_config.json (did train_org run for {org_id}?)")
    existing = register.find_version(areg, orun)
    if existing is not None:
        mv = store.get_version(areg, existing)
        return AdapterVersion(org_id, areg.model_name, existing, mv.tags["adapter_version"], str(adapter),
                              int(mv.tags["parent_version"]))
    info = register.lineage(cfg, orun)
    av = register_adapter_folder(cfg, org_id, adapter, info["tags"], info["metrics"])
    lake.write_json(o.dir.adapter,
                    {"org_id": org_id, "model_name": av.model_name, "version": av.version,
                     "adapter_version": av.adapter_version, "base_version": av.base_version})
    return av


def register_adapter_folder(cfg: Config, org_id: str, adapter: Path, tags: dict, metrics: dict | None = None
                            ) -> AdapterVersion:
    """A peft adapter folder as a new version of `rtrl-adapter-<org>`; tags must hold parent_version and run_id."""
    check_org(cfg, org_id)
    if "parent_version" not in tags or "run_id" not in tags:
        raise ValueError(f"adapter tags need parent_version and run_id, got {sorted(tags)}")
    areg = adapter_registry(cfg, org_id)
    tags = tags | {"kind": "org_adapter", "org_id": org_id, "base_model": cfg.mlflow.model_name}
    version = store.register_checkpoint(areg, adapter, run_name=str(tags["run_id"]), tags=tags, metrics=metrics)
    name = f"{org_id}-v{version}-{weights_digest(adapter)}"
    store.client(areg).set_model_version_tag(areg.model_name, str(version), "adapter_version", name)
    return AdapterVersion(org_id, areg.model_name, version, name, str(adapter), int(tags["parent_version"]))


def deploy_adapter(cfg: Config, o: OrgRun, version: int) -> bool:
    """Point the org's `live` alias at version iff every verdict the cycle requires (the data gates, the
    monitors, train, eval) and eval_org passed for the org's run."""
    verdicts = read_verdicts(Lake(cfg.lake_root), o.run_id)
    failing = [n for n in ADAPTER_VERDICTS if n not in verdicts or not verdicts[n].passed]
    if failing:
        return False
    promote.point(adapter_registry(cfg, o.org_id), LIVE_ALIAS, version, reason=f"org run {o.run_id}")
    return True


# --- an org A/B's decision (rl_core/ab/org.py judges; these record it, and promote.py moves the alias) -------------

def record_ab(cfg: Config, org_id: str, version: int, decision: str, summary: str) -> None:
    """An org A/B's decision on the adapter's version (tags ab.decision, ab.summary); nothing moves."""
    store.set_version_tags(adapter_registry(cfg, org_id), version, {"ab.decision": decision, "ab.summary": summary})


def keep_live(cfg: Config, org_id: str, version: int, reason: str) -> None:
    """An org A/B's promote: the adapter stays `live`, the decision recorded on its version (tag ab.kept_live_at, a
    line of its History; a retried apply adds no second line)."""
    areg = adapter_registry(cfg, org_id)
    store.set_version_tags(areg, version, {"ab.kept_live_at": store.stamp()})
    store.append_history(areg, version, f"kept live: {reason}", once=True)


def withdraw_live(cfg: Config, org_id: str, adapter_version: str, reason: str) -> int | None:
    """An org A/B's rollback: the org's `live` alias removed if it still names adapter_version, its version tagged
    rolled_back (rl_core.registry.promote.take_off_adapter, the one module that moves aliases); the org's base
    version answers it again. Returns that version, or None when the alias had moved on (nothing moves)."""
    return promote.take_off_adapter(cfg, check_org_id(org_id), adapter_version, reason)
