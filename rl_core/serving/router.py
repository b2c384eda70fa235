"""The `auto` router: which loaded version answers a request, following the MLflow aliases.

Slots hold one loaded backend each. Aliases (`champion`, `challenger`) point at slots; the map is
replaced in one assignment, so a request sees either the old or the new map, never a mix. When the
poller sees an alias move, the new version is loaded in the background while traffic continues on the
old one; then the map is swapped. A request holds a lease on its slot for its whole life (streaming
too), so in-flight requests finish on the weights they started with: a retired slot is closed only
when its last lease ends. Engines that can swap weights in place (vLLM's reload_weights) reuse a slot
no alias needs any more: new leases wait while the in-flight ones drain, then the reload runs. Such an
engine is kept as a spare (up to `spares`) when an alias goes away (a rollback, a promotion), so the next
deploy swaps weights into it in ~0.1 s instead of starting an engine (~45 s on 2 CPUs). With `prewarm`, a
gateway starts its spare right after the champion, before it takes traffic, so even the first deploy is a swap.
An org's live adapter (rl_core/orgs/serving.py) answers on the slot of its base version, inside that very engine
on vLLM (multi-LoRA): its lease is a lease on the slot as well, so a reload or retirement waits for it too.
`auto` sends a stable share of users to the challenger: sha256(user_id) mapped to [0, 1) < share.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("rtrl.serving.router")
ALIASES = ("champion", "challenger")
# a pinned version: ASCII digits only (str.isdigit() is true for '²', which int() refuses), at most an int64's 19
VERSION_RE = re.compile(r"[0-9]{1,19}")


class UnknownModel(LookupError):
    pass


class NotReady(RuntimeError):
    pass


def user_bucket(user_id: str) -> float:
    """A stable number in [0, 1) per user: the same user always lands in the same arm."""
    return int(hashlib.sha256(user_id.encode()).hexdigest()[:15], 16) / float(1 << 60)


@dataclass
class Lease:
    slot: "Slot"
    backend: object
    version: int
    arm: str
    released: bool = False
    adapter_version: str | None = None  # the org's LoRA adapter answering on this version (rl_core/orgs)
    adapter_hold: object | None = None  # that adapter's own count of requests in flight (release() ends it)

    def release(self) -> None:
        """Idempotent: a stream's generator and its finaliser may both call it."""
        if not self.released:
            self.released = True
            if self.adapter_hold is not None:
                self.adapter_hold.release()
            self.slot._release()


class Slot:
    def __init__(self, version: int, backend, checkpoint: str):
        self.version = version
        self.backend = backend
        self.checkpoint = checkpoint
        self.inflight = 0
        self.swapping = False
        self.retired = False
        self._cond = threading.Condition()

    def acquire(self, arm: str) -> Lease:
        with self._cond:
            while self.swapping:
                self._cond.wait()
            self.inflight += 1
            return Lease(self, self.backend, self.version, arm)

    def _release(self) -> None:
        with self._cond:
            self.inflight -= 1
            self._cond.notify_all()
            close_now = self.retired and self.inflight == 0
        if close_now:
            self._close()

    @property
    def reloadable(self) -> bool:
        """Its engine can swap weights in place (Slot.reload)."""
        return bool(getattr(self.backend, "supports_reload", False))

    def reload(self, version: int, checkpoint: str) -> None:
        """In-place weight swap: hold new leases, drain in-flight ones, reload, resume."""
        with self._cond:
            self.swapping = True
            while self.inflight:
                self._cond.wait()
        try:
            self.backend.reload(checkpoint)
            self.version, self.checkpoint = version, checkpoint
        finally:
            with self._cond:
                self.swapping = False
                self._cond.notify_all()

    def retire(self) -> None:
        with self._cond:
            self.retired = True
            close_now = self.inflight == 0
        if close_now:
            self._close()

    def _close(self) -> None:
        try:
            self.backend.close()
        except Exception:
            log.exception("closing backend of version %s failed", self.version)


BackendFactory = Callable[[Path, int], object]
CheckpointFor = Callable[[int], Path]
AliasSource = Callable[[], dict[str, int]]


class Router:
    def __init__(self, factory: BackendFactory, checkpoint_for: CheckpointFor, alias_source: AliasSource,
                 challenger_share: float, model_name: str = "rtrl-policy", poll_s: float = 10.0, adapters=None,
                 spares: int = 1, prewarm: bool = False):
        self.factory = factory
        self.checkpoint_for = checkpoint_for
        self.alias_source = alias_source
        self.share = challenger_share
        self.model_name = model_name
        self.poll_s = poll_s
        self.adapters = adapters  # rl_core.orgs.serving.AdapterPool or None: per-org adapters, synced with the aliases
        if adapters is not None:
            adapters.bind(self.engine_for)  # an adapter is loaded into (or beside) the engine serving its base
        self._aliases: dict[str, Slot] = {}
        self._slots: dict[int, Slot] = {}
        self.spares = spares
        self.prewarm = prewarm
        self._spare: list[Slot] = []  # reloadable engines no alias needs, kept warm for the next deploy
        self._sync_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None
        self.swaps = 0

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self, background: bool = True) -> None:
        """Load what the aliases point at (blocking), then the spares if `prewarm`, then poll for moves in a thread.
        Spares start before traffic: on 2 CPUs a vLLM engine starting beside a busy one starved and timed out."""
        self.sync()
        if self.prewarm:
            self.start_spares()
        if self.adapters is not None:
            self.adapters.sync()
        if background:
            self._thread = threading.Thread(target=self._poll, name="alias-poller", daemon=True)
            self._thread.start()

    def start_spares(self) -> int:
        """Start engines up to `spares` (champion weights, serving nobody) so that the next deploy swaps weights
        into one instead of starting an engine. Only engines that can reload in place; returns how many."""
        with self._sync_lock:
            champion = self._aliases.get("champion")
            if champion is None or not champion.reloadable:
                return 0
            need, version, ckpt = self.spares - len(self._spare), champion.version, champion.checkpoint
        started = 0
        for _ in range(max(need, 0)):
            if self._stop.is_set():
                break
            try:
                slot = Slot(version, self.factory(Path(ckpt), version), ckpt)  # ~45 s: outside the lock
            except Exception:  # noqa: BLE001 - a spare is an optimisation: a deploy will start an engine instead
                log.exception("starting a spare engine failed")
                break
            with self._sync_lock:
                keep = len(self._spare) < self.spares and not self._stop.is_set()
                if keep:
                    self._spare.append(slot)
                    started += 1
            if not keep:
                slot.retire()
        log.info("started %d spare engine(s)", started)
        return started

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.sync()
            if self.adapters is not None:
                self.adapters.sync()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        with self._sync_lock:
            for slot in [*self._slots.values(), *self._spare]:
                slot.retire()
            self._slots, self._aliases, self._spare = {}, {}, []

    # --- alias following --------------------------------------------------------------------------
    def sync(self) -> bool:
        """Make the loaded slots match the aliases. True when something changed. Errors keep the old state."""
        with self._sync_lock:
            try:
                wanted = {a: int(v) for a, v in self.alias_source().items() if a in ALIASES}
                if "champion" not in wanted and "champion" in self._aliases:
                    # a registry hiccup reads as "no aliases"; a champion is never unloaded that way
                    raise LookupError("the registry reports no champion; keeping the loaded versions")
                changed = self._reconcile(wanted)
                self.last_error = None
                return changed
            except Exception as exc:  # registry down, bad checkpoint: keep serving what is loaded
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("alias sync failed; serving the previous versions")
                return False

    def _reconcile(self, wanted: dict[str, int]) -> bool:
        current = {a: s.version for a, s in self._aliases.items()}
        if current == wanted and all(v in self._slots for v in wanted.values()):
            return False
        needed = set(wanted.values())
        slots = dict(self._slots)
        spare = [s for v, s in slots.items() if v not in needed and s.reloadable]
        spare += self._spare  # idle ones last: pop() takes them first
        for version in sorted(needed - set(slots)):
            ckpt = self.checkpoint_for(version)
            if spare:  # reuse an engine no alias needs: reload its weights in place
                slot = spare.pop()
                if slots.get(slot.version) is slot:
                    del slots[slot.version]
                slot.reload(version, str(ckpt))
            else:  # load beside the old one; traffic continues on the old slot meanwhile
                slot = Slot(version, self.factory(ckpt, version), str(ckpt))
            slots[version] = slot
        new_aliases = {a: slots[v] for a, v in wanted.items()}
        used = {id(s) for s in slots.values()}
        idle = [s for v, s in slots.items() if v not in needed] + [s for s in self._spare if id(s) not in used]
        keep = [s for s in idle if s.reloadable][: self.spares]
        self._slots = {v: s for v, s in slots.items() if v in needed}
        self._aliases = new_aliases  # the atomic switch
        self._spare = keep  # no longer routable (not in _slots); reloaded before it serves again
        for s in idle:
            if all(s is not k for k in keep):
                s.retire()
        self.swaps += 1
        log.info("serving %s", {a: s.version for a, s in new_aliases.items()})
        return True

    # --- routing ----------------------------------------------------------------------------------
    def route(self, model: str, user_id: str, org: str | None = None) -> Lease:
        """The lease answering `model` for this user; the org's live adapter when one fits (see adapters)."""
        lease = self._route(model, user_id)
        return self.adapters.select(org, lease, user_id) if self.adapters is not None else lease

    def _route(self, model: str, user_id: str) -> Lease:
        aliases = self._aliases  # one read: the whole request uses this map
        if model == "auto":
            if "champion" not in aliases:
                raise NotReady("no champion is loaded yet")
            arm = "challenger" if "challenger" in aliases and user_bucket(user_id) < self.share else "champion"
            return aliases[arm].acquire(arm)
        if model in ALIASES:
            if model not in aliases:
                raise UnknownModel(f"model {model!r}: no version holds the alias {model!r}")
            return aliases[model].acquire(model)
        prefix = self.model_name + "/"
        if model.startswith(prefix) and VERSION_RE.fullmatch(model[len(prefix):]):
            slot = self._slots.get(int(model[len(prefix):]))
            if slot is None:
                raise UnknownModel(f"model {model!r} is not loaded; loaded: {self.model_ids()}")
            return slot.acquire("pinned")
        raise UnknownModel(f"unknown model {model!r}; choose one of {['auto', *self.model_ids()]}")

    def engine_for(self, version: int):
        """The engine serving `version` now (None when no alias needs it): where its adapters are loaded."""
        slot = self._slots.get(version)
        return None if slot is None else slot.backend

    def model_ids(self) -> list[str]:
        return [*self._aliases, *(f"{self.model_name}/{v}" for v in sorted(self._slots))]

    def versions(self) -> dict[str, int]:
        return {a: s.version for a, s in self._aliases.items()}

    @property
    def ready(self) -> bool:
        return "champion" in self._aliases

    def any_tokenizer(self):
        slot = self._aliases.get("champion") or next(iter(self._slots.values()), None)
        if slot is None:
            raise NotReady("no model is loaded yet")
        return slot.backend.tokenizer
