"""What users saw, from the simulator's own per-request records: per-user rates, paired tests, guards.

Every request a simulated user sends leaves a record (users.request_record): its outcome, whether the edit
persisted or was reverted, the follow-up and whether the rewards' lexicon calls it dissatisfied, the thumbs
sent, the latency, the answer's features. A protocol's summary keeps the first and the measured cycle's records
raw, so a reader can recompute every number here; the numbers:

- per user, per cycle: the rate of each outcome over the user's requests (edits persisting, edits reverted,
  dissatisfied follow-ups, each answer feature) and the mean latency;
- per metric, paired by user (the same users in the first and the measured cycle): the mean difference with a
  paired t 95% CI (experiment.paired), which is the primary test when a protocol's primary is
  `edit_persisted_rate` (the user, not the request, is the independent unit: a user's requests share habits);
- a guard as a non-inferiority test: the metric must not get worse by more than the tolerance, judged on the
  CI's bound (lower bound of the difference above -tolerance where higher is better, upper bound below
  +tolerance where lower is better), never on the point estimate;
- per cycle, request-level rates with counts, and between the two cycles a two-proportion (Newcombe) interval:
  descriptive only (requests of one user are not independent), for protocols with no `rtrl ab` (the org
  adapters have no version of their own to compare).
"""

from __future__ import annotations

import math

from lab.simulate.experiment import CycleMetrics, Paired, paired
from rl_core.features import Rate

# metric -> +1 when higher is better, -1 when lower is better (an answer feature: +1, "must not fall")
OUTCOME_METRICS = {"edit_persisted_rate": +1, "edit_reverted_rate": -1, "dissatisfied_rate": -1, "latency_ms": -1}
_FIELD = {"edit_persisted_rate": "edit_persisted", "edit_reverted_rate": "edit_reverted",
          "dissatisfied_rate": "dissatisfied"}
# the A/B's own metrics reported beside the reward (rl_core.ab.verdict.METRICS)
AB_METRICS = ("edit_persisted_rate", "dissatisfied_rate", "latency_p50_ms", "latency_p90_ms", "reward")


def direction(metric: str) -> int:
    return OUTCOME_METRICS.get(metric, +1)


def _value(r: dict, metric: str) -> float:
    if metric == "latency_ms":
        return float(r["latency_ms"])
    if metric in _FIELD:
        return float(bool(r[_FIELD[metric]]))
    return float(metric in r.get("features", ()))  # an answer feature's rate


def user_rates(records: list[dict], metric: str) -> dict[str, float]:
    """user -> the metric's mean over the user's requests (a rate for a 0/1 outcome)."""
    by: dict[str, list[float]] = {}
    for r in records:
        by.setdefault(r["user_id"], []).append(_value(r, metric))
    return {u: sum(x) / len(x) for u, x in sorted(by.items())}


def noninferior(p: Paired | None, tolerance: float, higher_is_better: bool = True) -> bool:
    """The guard: the CI's bound on the bad side within the tolerance (no interval: not shown, so False)."""
    if p is None:
        return False
    return p.ci_low > -tolerance if higher_is_better else p.ci_high < tolerance


def paired_metric(first: list[dict], last: list[dict], metric: str, tolerance: float | None = None) -> dict | None:
    """The metric's per-user paired test (last - first), with its non-inferiority verdict at tolerance."""
    p = paired(user_rates(first, metric), user_rates(last, metric))
    if p is None:
        return None
    up = direction(metric) > 0
    out = {**p.__dict__, "excludes_zero": p.excludes_zero, "higher_is_better": up}
    if tolerance is not None:
        out |= {"tolerance": tolerance, "noninferior": noninferior(p, tolerance, up)}
    return out


def newcombe(k1: int, n1: int, k2: int, n2: int, z: float = 1.959964) -> dict | None:
    """p2 - p1 with Newcombe's hybrid score 95% interval (Wilson intervals of each proportion combined)."""
    if n1 == 0 or n2 == 0:
        return None

    p1, p2 = k1 / n1, k2 / n2
    r1, r2 = Rate.of(k1, n1, z), Rate.of(k2, n2, z)  # each proportion's Wilson interval
    (l1, u1), (l2, u2) = (r1.ci_low, r1.ci_high), (r2.ci_low, r2.ci_high)
    d = p2 - p1
    return {"first": p1, "last": p2, "diff": d, "ci_low": d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2),
            "ci_high": d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2), "n_first": n1, "n_last": n2}


def cycle_rates(records: list[dict]) -> dict:
    """Request-level counts and rates of one cycle (what the raters did included)."""
    n = len(records)
    count = {m: sum(bool(r[f]) for r in records) for m, f in _FIELD.items()}
    lat = sorted(r["latency_ms"] for r in records)
    return {"requests": n, "users": len({r["user_id"] for r in records}),
            "heldout_requests": sum(bool(r.get("heldout")) for r in records),
            **{m: {"k": k, "rate": k / n if n else None} for m, k in count.items()},
            "latency_ms": {"mean": sum(lat) / n if n else None, "p50": lat[n // 2] if n else None,
                           "p90": lat[int(n * 0.9)] if n else None},
            "thumbs": {"given": sum(len(r["thumbs"]) for r in records),
                       "up": sum(sum(r["thumbs"]) for r in records),
                       "dropped": sum(r["thumbs_dropped"] for r in records),
                       "flipped": sum(r["thumbs_flipped"] for r in records),
                       "answers_rated": sum(bool(r["thumbs"]) for r in records)},
            "outcomes": {o: sum(r["outcome"] == o for r in records) for o in sorted({r["outcome"] for r in records})}}


def outcome_summary(first: CycleMetrics, last: CycleMetrics, guards: list[str], tolerance: float) -> dict:
    """The first and the measured cycle compared on what users saw: each cycle's rates, every outcome metric's
    per-user paired test (a guard's with its non-inferiority verdict), the request-level Newcombe intervals,
    and the per-user rates the tests read (so a reader can redo them)."""
    a, b = first.requests, last.requests
    metrics = list(dict.fromkeys([*OUTCOME_METRICS, *guards]))
    tests = {m: paired_metric(a, b, m, tolerance if m in guards else None) for m in metrics}
    two = {m: newcombe(sum(bool(r[f]) for r in a), len(a), sum(bool(r[f]) for r in b), len(b))
           for m, f in _FIELD.items()}
    return {"first_cycle": first.cycle, "last_cycle": last.cycle, "first": cycle_rates(a), "last": cycle_rates(b),
            "paired": tests, "requests_two_proportion": two,
            "guards": {g: {"tolerance": tolerance, "noninferior": bool(tests[g] and tests[g]["noninferior"])}
                       for g in guards},
            "per_user": {m: {"first": user_rates(a, m), "last": user_rates(b, m)}
                         for m in ("edit_persisted_rate", "dissatisfied_rate")}}


def ab_view(ab: dict) -> dict:
    """`rtrl ab`'s comparison of the A/B metrics beside the reward, from its own result (judge_last's `ab`):
    challenger - champion with its interval and whether it is significantly better or worse."""
    ms = ab.get("metrics") or {}
    keep = ("champion", "challenger", "diff", "lo", "hi", "p_value", "better", "worse", "method")
    return {m: {k: ms[m].get(k) for k in keep} for m in AB_METRICS if m in ms}


def adapter_kl(cfg, curves: list[CycleMetrics]) -> dict[str, dict[str, float | None]]:
    """cycle run id -> org -> the KL its adapter's update reached (the adapter run's train summary), for every
    cycle that trained org adapters."""
    from rl_core.lake import Lake
    from rl_core.orgs.pipeline import org_run_id

    lake = Lake(cfg.lake_root)
    out: dict[str, dict[str, float | None]] = {}
    for c in curves:
        for org in sorted(cfg.simulate.conventions):
            summary = lake.read_train_summary(org_run_id(c.run_id, org))
            if summary is not None:
                out.setdefault(c.run_id, {})[org] = summary.kl
    return out
