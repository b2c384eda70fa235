"""Rewards -> advantages: reward minus a baseline, then normalised.

Production traffic rarely has several samples of one prompt, but when it does (retries, A/B pairs,
the simulator) the group mean is the best baseline (GRPO). Every other episode is compared with a
running baseline of its organisation/task: an exponential moving average of earlier rewards in time
order, seeded with that key's mean in this cycle so the first episode of a key is not compared with 0.
Normalising divides by the standard deviation over the cycle (no re-centering: the sign an episode's
baseline gave it is kept). `credit_weight` (session granularity) scales the result per episode.
Pure numpy: runs in the data step of every rank with identical results.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

import numpy as np


@dataclass
class AdvantageResult:
    advantages: np.ndarray  # [N] float64
    baselines: np.ndarray  # [N] float64
    grouped: int  # episodes whose baseline was their prompt group's mean
    running: int  # episodes whose baseline was the running per-org/task mean


def compute_advantages(
    rewards: np.ndarray,
    group_keys: list[str],
    running_keys: list[str],
    order: np.ndarray,
    mode: Literal["group", "running"] = "group",
    decay: float = 0.9,
    normalize: bool = True,
    credit: np.ndarray | None = None,
    eps: float = 1e-8,
) -> AdvantageResult:
    """rewards [N]; group_keys: same value = same prompt; running_keys: org/task; order [N]: time order."""
    r = np.asarray(rewards, dtype=np.float64)  # [N]
    n = len(r)
    if not (len(group_keys) == len(running_keys) == len(order) == n):
        raise ValueError("rewards, group_keys, running_keys and order must have the same length")
    if not np.all(np.isfinite(r)):
        raise ValueError("rewards must be finite")
    base = np.zeros(n)  # [N]
    in_group = np.zeros(n, dtype=bool)  # [N]
    if mode == "group":
        members: dict[str, list[int]] = defaultdict(list)
        for i, k in enumerate(group_keys):
            members[k].append(i)
        for idx in members.values():
            if len(idx) > 1:
                base[idx] = r[idx].mean()
                in_group[idx] = True
    elif mode != "running":
        raise ValueError(f"advantage mode {mode!r}: choose 'group' or 'running'")

    rest = np.flatnonzero(~in_group)
    key_mean = defaultdict(list)
    for i in rest:
        key_mean[running_keys[i]].append(r[i])
    ema = {k: float(np.mean(v)) for k, v in key_mean.items()}
    for i in sorted(rest, key=lambda j: (order[j], j)):
        k = running_keys[i]
        base[i] = ema[k]
        ema[k] = decay * ema[k] + (1.0 - decay) * r[i]

    adv = r - base  # [N]
    if normalize and n > 1:
        std = adv.std()
        adv = adv / (std + eps) if std > eps else np.zeros(n)
    if credit is not None:
        adv = adv * np.asarray(credit, dtype=np.float64)
    return AdvantageResult(advantages=adv, baselines=base, grouped=int(in_group.sum()), running=int(len(rest)))
