"""`rtrl init`: the base checkpoint becomes version 1 of the registered model, alias `champion`.

Idempotent: the conversion is cached in models_dir, and an existing champion is left as it is, so a
rerun is instant and never moves an alias that later cycles have moved.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

from rl_core import models
from rl_core.config import Config, load_config
from rl_core.registry import card, promote, store
from rl_core.runtime.procs import make_home, private_state


@dataclass
class InitResult:
    checkpoint: Path
    version: int
    created: bool
    sample: str


def init(cfg: Config, check_generation: bool = True) -> InitResult:
    make_home(cfg)
    ckpt = models.base_checkpoint(cfg)
    sample = models.smoke_generate(ckpt) if check_generation else ""
    champion = store.version_for_alias(cfg, "champion")
    if champion is not None:
        return InitResult(ckpt, champion, False, sample)
    version = store.register_checkpoint(
        cfg,
        ckpt,
        run_name=f"base-{cfg.model.base}",
        tags={"parent_version": "none", "base": cfg.model.base, "kind": "base", "profile": cfg.profile},
        params={"base": cfg.model.base, "dtype": cfg.model.dtype},
    )
    promote.point(cfg, "champion", version, f"rtrl init: base checkpoint {cfg.model.base}")
    card.describe(cfg, version)
    return InitResult(ckpt, version, True, sample)


def add_init(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-check", action="store_true", help="skip the generation smoke check")
    p.set_defaults(run=_run)


def _run(args) -> int:
    cfg = load_config()
    private_state(cfg, create_home=True)  # the rtrl command set it already; this is what `rtrl init` relies on
    t0 = time.time()
    r = init(cfg, check_generation=not args.no_check)
    state = "registered" if r.created else "already registered"
    print(f"base model   {cfg.model.base} -> {r.checkpoint}")
    if r.sample:
        print(f"generates    {r.sample!r}")
    print(f"mlflow       {cfg.mlflow.model_name} version {r.version} ({state}), alias champion")
    print(f"tracking     {cfg.tracking_uri}")
    print(f"done in {time.time() - t0:.1f}s")
    return 0
