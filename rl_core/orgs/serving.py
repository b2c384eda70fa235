"""Serving an org's live adapter to that org's traffic, in (or beside) the engine that serves its base version.

Why here and not in a slot: an adapter only makes sense on the base version it was trained on. The router
picks the arm as before (auto/champion/challenger/pinned); when the request's org has a `live` adapter
(rl_core/orgs/registry.py) whose base version is the version that arm serves, and the arm is not an
explicit pin, the request is answered by that adapter instead and the lease carries its never-reused
name, which the gateway logs as interactions.adapter_version and returns in x-rtrl-adapter-version.

Where an adapter lives: it is loaded while an engine serves its base version (Router.engine_for), and answers
only on that engine. An engine that serves LoRA adapters (vLLM with serving.vllm_lora: multi-LoRA) gets it at
runtime under its name (/v1/load_lora_adapter) and answers with model=<name>: the same engine, batches and
logprobs as its base, no second stack. Any other engine (transformers: the fallback and the tests' path) gets
a copy of its base with the adapter merged in beside it (peft merge_and_unload: same outputs, plain-model speed).

A share of the org's users (`[orgs] ab_share`, default 1.0: all of them): with a share below 1, a user of the org
is answered by the adapter only when a stable number per user, the router's user_bucket of the user salted with the
org (in_adapter_arm: independent of the champion/challenger split and of every other org's), is below the share;
the others get the base answer, logged with adapter_version null. `rtrl ab --org` compares the two groups
(rl_core/ab/org.py).

Going off traffic: when the `live` alias moves, is removed (a rollback) or the org opts out
(harvest.opt_out_orgs), the new map is swapped in at once and the old adapter is retired: every request in
flight on it holds a count on it and finishes on it, and the last one out unloads it (/v1/unload_lora_adapter,
or the merged copy is closed). A request that finds it retired is answered by what replaced it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from rl_core.config import Config
from rl_core.orgs.registry import AdapterVersion, live_adapter
from rl_core.registry import store
from rl_core.serving.backends.base import OnAdapter
from rl_core.serving.router import user_bucket

log = logging.getLogger("rtrl.orgs.serving")
AB_SALT = "rtrl-org-adapter-ab"  # the per-org split's own salt: never the champion/challenger split's buckets


def in_adapter_arm(org: str, user_id: str | None, share: float) -> bool:
    """Is this user of the org answered by its live adapter? Every user at share 1.0, none at 0.0; in between those
    whose salted user_bucket (AB_SALT, the org, the user) is below the share: the same user always gets the same
    answer, and the split is independent of the champion/challenger split (unsalted) and of other orgs'. A request
    without a user (not from the gateway, which always has one) gets the base answer unless every user gets the
    adapter."""
    if share >= 1.0:
        return True
    if share <= 0.0 or not user_id:
        return False
    return user_bucket(f"{AB_SALT}\x00{org}\x00{user_id}") < share


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
    """One org's adapter on the engine of its base version, with its count of requests in flight."""

    adapter_version: str
    base_version: int
    base_engine: object  # the engine serving base_version when it was loaded: the adapter answers only there
    backend: object  # what answers: OnAdapter(base_engine, name) (multi-LoRA) or a merged copy of the base
    inflight: int = 0
    retired: bool = False
    unloaded: threading.Event = field(default_factory=threading.Event, repr=False)
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)

    def acquire(self) -> bool:
        """Count one more request on it; False once it is retired (the caller then reads the new state)."""
        with self._cond:
            if self.retired:
                return False
            self.inflight += 1
            return True

    def release(self) -> None:
        """A request on it finished; the last one out of a retired adapter unloads it (in a thread: release
        may run on the server's event loop)."""
        with self._cond:
            self.inflight -= 1
            last = self.retired and self.inflight == 0
        if last:
            threading.Thread(target=self._unload, name=f"unload-{self.adapter_version}", daemon=True).start()

    def retire(self) -> None:
        """Off traffic: no new request gets it; unloaded now, or when its requests in flight have finished."""
        with self._cond:
            if self.retired:
                return
            self.retired = True
            now = self.inflight == 0
        if now:
            self._unload()

    def _unload(self) -> None:
        try:
            if isinstance(self.backend, OnAdapter):
                self.base_engine.unload_adapter(self.adapter_version)
            else:
                self.backend.close()
            log.info("adapter %s unloaded", self.adapter_version)
        except Exception:  # noqa: BLE001 - an engine gone or restarting has lost it anyway
            log.exception("unloading adapter %s failed", self.adapter_version)
        finally:
            self.unloaded.set()


EngineFor = Callable[[int], object | None]


class AdapterPool:
    """The live adapter of each org that has a bearer token, kept in step with the registry by sync()."""

    def __init__(self, cfg: Config, orgs: list[str] | None = None):
        self.cfg = cfg
        self.orgs = sorted(set(orgs if orgs is not None else cfg.serving.tokens.values()))
        self._loaded: dict[str, LoadedAdapter] = {}
        self._lock = threading.Lock()
        self._engine_for: EngineFor = lambda version: None
        self.last_error: str | None = None

    def bind(self, engine_for: EngineFor) -> None:
        """Where base versions are served (the router's Router.engine_for)."""
        self._engine_for = engine_for

    def sync(self) -> bool:
        """Load adapters whose `live` alias moved or whose base engine changed; retire those without one (no
        alias, opted out, base not served). True when something changed. Errors keep that org's state."""
        changed = False
        with self._lock:
            for org in self.orgs:
                try:
                    changed |= self._sync_org(org)
                except Exception as exc:  # registry down or a bad adapter: keep what is loaded
                    self.last_error = f"{org}: {type(exc).__name__}: {exc}"
                    log.exception("adapter sync for %s failed; keeping the previous state", org)
        return changed

    def _sync_org(self, org: str) -> bool:
        live = None if org in self.cfg.harvest.opt_out_orgs else live_adapter(self.cfg, org)
        engine = self._engine_for(int(live.base_version)) if live is not None else None
        have = self._loaded.get(org)
        if have is not None and live is not None and (have.adapter_version, have.base_version, have.base_engine) \
                == (live.adapter_version, int(live.base_version), engine):
            return False
        if have is None and (live is None or engine is None):
            return False
        new = self._load(live, engine) if live is not None and engine is not None else None
        loaded = {o: a for o, a in self._loaded.items() if o != org}
        self._loaded = {**loaded, org: new} if new is not None else loaded  # the switch: new requests see it
        if have is not None:
            have.retire()  # unloaded once its requests in flight have finished
        log.info("org %s: serving %s", org, f"adapter {new.adapter_version} on version {new.base_version}"
                 if new is not None else "its base version (no live adapter, opted out, or its base not served)")
        return True

    def _load(self, live: AdapterVersion, engine) -> LoadedAdapter:
        """Into the base's engine when it serves adapters (multi-LoRA), else a merged copy beside it."""
        base = int(live.base_version)
        if getattr(engine, "supports_lora", False):
            engine.load_adapter(live.adapter_version, str(live.path))
            backend = OnAdapter(engine, live.adapter_version)
        else:
            backend = load_adapter_backend(store.checkpoint_path(self.cfg, base), live.path, self.cfg.model.dtype)
        return LoadedAdapter(live.adapter_version, base, engine, backend)

    def select(self, org: str | None, lease, user_id: str | None = None):
        """The lease to answer with: the org's adapter on the arm's version and engine when the user is in the
        adapter's share of the org (in_adapter_arm, `[orgs] ab_share`), else the lease unchanged."""
        if not org or lease.arm == "pinned" or not in_adapter_arm(org, user_id, self.cfg.orgs.ab_share):
            return lease
        for _ in range(2):  # a swap may retire the adapter just read: read the new state once more
            have = self._loaded.get(org)
            if have is None or lease.version != have.base_version or lease.backend is not have.base_engine:
                return lease
            if have.acquire():
                return replace(lease, backend=have.backend, adapter_version=have.adapter_version, adapter_hold=have)
        return lease

    def served(self) -> dict[str, str]:
        return {org: a.adapter_version for org, a in self._loaded.items()}

    def loaded(self, org: str) -> LoadedAdapter | None:
        """The org's adapter now (for operators and tests: its engine, requests in flight, unload event)."""
        return self._loaded.get(org)
