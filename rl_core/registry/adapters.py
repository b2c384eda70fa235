"""An org adapter's names and reads in the registry: the model `rtrl-adapter-<org>`, its `live` alias, the
version serving an org now. Below both the org side (rl_core/orgs/registry.py registers and deploys adapters) and
the one module that moves aliases (rl_core/registry/promote.py takes one off traffic), so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from rl_core.config import Config
from rl_core.registry import store

ADAPTER_PREFIX = "rtrl-adapter-"
LIVE_ALIAS = "live"


@dataclass
class AdapterVersion:
    org_id: str
    model_name: str
    version: int
    adapter_version: str  # the never-reused serving name
    path: str
    base_version: int = 0  # the rtrl-policy version it was trained on (and must be served on)


def adapter_model_name(org_id: str) -> str:
    return f"{ADAPTER_PREFIX}{org_id}"


def adapter_registry(cfg: Config | store.Registry, org_id: str) -> store.Registry:
    """The registry under the org's adapter model: what every registry function (store, drift, promote) takes."""
    return store.Registry.of(cfg).for_model(adapter_model_name(org_id))


def live_adapter(cfg: Config, org_id: str) -> AdapterVersion | None:
    """The adapter serving org_id now (alias `live`), or None: what the gateway asks per org."""
    areg = adapter_registry(cfg, org_id)
    version = store.version_for_alias(areg, LIVE_ALIAS)
    return None if version is None else _adapter(areg, org_id, version)


def newest_adapter(cfg: Config, org_id: str) -> AdapterVersion | None:
    """The org's newest registered adapter, live or not (one its gates refused included), or None."""
    areg = adapter_registry(cfg, org_id)
    versions = store.known_versions(areg)
    return _adapter(areg, org_id, max(versions)) if versions else None


def _adapter(areg: store.Registry, org_id: str, version: int) -> AdapterVersion:
    mv = store.get_version(areg, version)
    return AdapterVersion(org_id, areg.model_name, version, mv.tags.get("adapter_version", ""),
                          str(store.checkpoint_path(areg, version)), int(mv.tags.get("parent_version", 0)))
