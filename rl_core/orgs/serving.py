"""Serving an org's adapter to that org's traffic (transformers backend: peft).

Why here and not in a slot: an adapter only makes sense on the base version it was trained on. The router
picks the arm as before (auto/champion/challenger/pinned); when the request's org has a `live` adapter
(rl_core/orgs/registry.py) whose base version is the version that arm serves, and the arm is not an
explicit pin, the request is answered by that adapter instead and the lease carries its never-reused
name, which the gateway logs as interactions.adapter_version and returns in x-rtrl-adapter-version.
The adapter is merged into a copy of its base (peft merge_and_unload: same outputs, plain-model speed).
A replaced adapter is dropped, not closed: requests still using it finish on it and the GC frees it.
vLLM (multi-LoRA: --enable-lora + /v1/load_lora_adapter under the same names) is not wired here yet.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from rl_core.config import Config
from rl_core.orgs.registry import live_adapter
from rl_core.registry import store

log = logging.getLogger("rtrl.orgs.serving")


def load_adapter_backend(base_checkpoint: str | Path, adapter_dir: str | Path, dtype: str = "float32"):
    """A TransformersBackend answering with base + adapter (merged)."""
    from peft import PeftModel  # lazy: heavy (torch, peft)

    from rl_core.serving.backends.hf import TransformersBackend

    backend = TransformersBackend(base_checkpoint, dtype=dtype)
    backend.model = PeftModel.from_pretrained(backend.model, str(adapter_dir)).merge_and_unload()
    backend.model.eval()
    backend.checkpoint = f"{base_checkpoint}+{adapter_dir}"
    return backend


@dataclass
class LoadedAdapter:
    adapter_version: str
    base_version: int
    backend: object


class AdapterPool:
    """The live adapter of each org that has a bearer token, kept in step with the registry by sync()."""

    def __init__(self, cfg: Config, orgs: list[str] | None = None):
        self.cfg = cfg
        self.orgs = sorted(set(orgs if orgs is not None else cfg.serving.tokens.values()))
        self._loaded: dict[str, LoadedAdapter] = {}
        self._lock = threading.Lock()
        self.last_error: str | None = None

    def sync(self) -> bool:
        """Load adapters whose `live` alias moved; drop those without one. True when something changed."""
        changed = False
        with self._lock:
            for org in self.orgs:
                try:
                    live = live_adapter(self.cfg, org)
                    have = self._loaded.get(org)
                    if live is None:
                        if have is not None:
                            del self._loaded[org]
                            changed = True
                        continue
                    if have is not None and have.adapter_version == live.adapter_version:
                        continue
                    base = int(live.base_version)
                    backend = load_adapter_backend(store.checkpoint_path(self.cfg, base), live.path,
                                                   self.cfg.model.dtype)
                    self._loaded = {**self._loaded, org: LoadedAdapter(live.adapter_version, base, backend)}
                    changed = True
                    log.info("org %s: serving adapter %s on version %s", org, live.adapter_version, base)
                except Exception as exc:  # registry down or a bad adapter: keep what is loaded
                    self.last_error = f"{org}: {type(exc).__name__}: {exc}"
                    log.exception("adapter sync for %s failed; keeping the previous state", org)
        return changed

    def select(self, org: str | None, lease):
        """The lease to answer with: the org's adapter on the arm's version, else the lease unchanged."""
        have = self._loaded.get(org) if org else None
        if have is None or lease.arm == "pinned" or lease.version != have.base_version:
            return lease
        return replace(lease, backend=have.backend, adapter_version=have.adapter_version)

    def served(self) -> dict[str, str]:
        return {org: a.adapter_version for org, a in self._loaded.items()}
