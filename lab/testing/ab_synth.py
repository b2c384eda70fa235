"""Simulated A/B logs with planted effects: raw interactions + feedback in the lake's contract schema.

Why here and not the HTTP simulator: the A/B analysis must be checked at sizes (1M interactions) and in
repetitions (null-data coverage) that no model-serving simulation reaches in seconds, and with effects
known exactly. Everything is vectorised numpy/pyarrow, so 1M interactions take a few seconds.

The data-generating process, per user u (users are the randomisation unit, as in the gateway's router):
  arm: challenger with probability `challenger_share`, else champion (fixed for the user)
  activity: Gamma(1) weight, so some users send many more turns than others (clusters of unequal size)
  propensities: arm rate + a user offset N(0, user_sd) for edit-persisted and dissatisfied follow-ups,
  and a user latency factor exp(N(0, 0.25)); each turn is then an independent draw.
Optional pre-period: the same users, all on the champion, in the `pre_hours` before the window, with
the same user offsets (what CUPED exploits).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lab.testing.columns import US, const, lists, pick, timestamps, uuids, write_to_lake
from lab.testing.texts import AB_DISSATISFIED, AB_NEUTRAL
from rl_core.schema import FEEDBACK_SCHEMA, INTERACTIONS_SCHEMA

__all__ = ["ArmSpec", "synth_ab", "write_to_lake"]  # write_to_lake: the tests write what they draw


@dataclass
class ArmSpec:
    """What one arm does on average: rates per interaction and latency (lognormal around the median)."""

    version: int
    edit_persisted: float = 0.30
    dissatisfied: float = 0.10
    latency_median_ms: float = 800.0
    latency_sigma: float = 0.5


def _same_list(values: list, n: int, type_) -> pa.Array:
    """n rows holding the same list."""
    return lists(np.full(n, len(values)), pa.array(np.tile(values, n), type=type_))


def _interactions(rng, n, users, user_of, arm_is_chall, version_of_arm, t0_us, span_s, latency, orgs):
    user_ids = pa.array([f"user-{u:06d}" for u in range(users)])
    uid = user_ids.take(pa.array(user_of))
    offsets = np.sort(rng.integers(0, int(span_s * 1e6), n))  # us after t0
    ts_req = timestamps(t0_us + offsets)
    ts_resp = timestamps(t0_us + offsets + (latency * 1000).astype(np.int64))
    arm = pa.array(np.where(arm_is_chall, "challenger", "champion"))
    table = pa.table(
        {
            "event_id": uuids(rng, n, variant_draw=True),
            "org_id": pa.array(orgs).take(pa.array(user_of % len(orgs))),
            "user_id": uid,
            "session_id": pc.binary_join_element_wise(const("sess", n, pa.string()), uid, "-"),
            "turn_index": pa.array(np.zeros(n, dtype=np.int32)),
            "ts_request": ts_req,
            "ts_response": ts_resp,
            "requested_model": const("auto", n),
            "model_version": pa.array(np.where(arm_is_chall, version_of_arm[1], version_of_arm[0]).astype(np.int64)),
            "adapter_version": pa.nulls(n, pa.string()),
            "arm": arm,
            "messages": const(json.dumps([{"role": "user", "content": "fix the failing test"}]), n),
            "prompt_token_ids": _same_list([1, 2, 3], n, pa.int32()),
            "completion_token_ids": _same_list([4, 5], n, pa.int32()),
            "completion_logprobs": _same_list([-0.5, -0.25], n, pa.float32()),
            "completion_text": const("Here is the fix.", n),
            "tool_calls": pa.nulls(n, pa.string()),
            "finish_reason": const("stop", n),
            "latency_ms": pa.array(latency),
            "ttft_ms": pa.array(latency * 0.2),
            "temperature": const(0.7, n, pa.float32()),
            "top_p": const(1.0, n, pa.float32()),
        }
    )
    return table.cast(INTERACTIONS_SCHEMA), offsets


def _feedback(rng, events: pa.Table, offsets_us, t0_us, persisted, reverted, followup, dissatisfied) -> pa.Table:
    parts = []

    def add(mask, kind, value_bool=None, value_float=None, texts=None, delay_min=30.0):
        idx = np.flatnonzero(mask)
        m = len(idx)
        if m == 0:
            return
        delay = (rng.exponential(delay_min, m) * 60e6).astype(np.int64)
        text = pa.nulls(m, pa.string())
        if texts is not None:
            text = pick(texts, rng.integers(0, len(texts), m))
        parts.append(
            pa.table(
                {
                    "feedback_id": uuids(rng, m, variant_draw=True),
                    "event_id": events["event_id"].take(pa.array(idx)),
                    "org_id": events["org_id"].take(pa.array(idx)),
                    "ts": timestamps(t0_us + offsets_us[idx] + delay),
                    "kind": const(kind, m),
                    "value_bool": pa.nulls(m, pa.bool_()) if value_bool is None else const(value_bool, m),
                    "value_float": pa.nulls(m, pa.float64()) if value_float is None else const(value_float, m),
                    "text": text,
                }
            ).cast(FEEDBACK_SCHEMA)
        )

    add(persisted | reverted, "edit_applied", delay_min=2.0)
    add(persisted, "edit_persisted", value_float=24.0, delay_min=60.0)
    add(reverted, "edit_reverted", delay_min=20.0)
    add(followup & dissatisfied, "followup_message", texts=AB_DISSATISFIED, delay_min=3.0)
    add(followup & ~dissatisfied, "followup_message", texts=AB_NEUTRAL, delay_min=3.0)
    add(persisted & (rng.random(len(persisted)) < 0.05), "thumbs", value_bool=True, delay_min=5.0)
    return pa.concat_tables(parts) if parts else FEEDBACK_SCHEMA.empty_table()


def synth_ab(
    n: int,
    users: int,
    start: datetime,
    end: datetime,
    champion: ArmSpec,
    challenger: ArmSpec,
    *,
    challenger_share: float = 0.5,
    user_sd: float = 0.1,
    pre_hours: float = 0.0,
    pre_n: int = 0,
    orgs: tuple[str, ...] = ("org-acme", "org-globex"),
    seed: int = 0,
) -> tuple[pa.Table, pa.Table]:
    """(interactions, feedback) of a simulated A/B window [start, end) (plus a pre-period if asked)."""
    if start.tzinfo is None or end.tzinfo is None or end <= start:
        raise ValueError("start/end must be tz-aware with start < end")
    rng = np.random.default_rng(seed)
    chall_user = rng.random(users) < challenger_share
    activity = rng.gamma(1.0, 1.0, users)
    off_persist = rng.normal(0, user_sd, users)
    off_dissat = rng.normal(0, user_sd / 2, users)
    off_lat = rng.normal(0, 0.25, users)

    def block(count, t0, span_s, all_champion):
        t0_us = int(t0.timestamp() * US)
        user_of = rng.choice(users, size=count, p=activity / activity.sum())
        is_chall = np.zeros(count, dtype=bool) if all_champion else chall_user[user_of]
        spec = lambda a, b: np.where(is_chall, b, a)  # noqa: E731
        p_persist = np.clip(spec(champion.edit_persisted, challenger.edit_persisted) + off_persist[user_of], 0, 1)
        p_dissat = np.clip(spec(champion.dissatisfied, challenger.dissatisfied) + off_dissat[user_of], 0, 1)
        median = spec(champion.latency_median_ms, challenger.latency_median_ms)
        sigma = spec(champion.latency_sigma, challenger.latency_sigma)
        latency = median * np.exp(off_lat[user_of] + sigma * rng.standard_normal(count))
        events, offsets = _interactions(
            rng, count, users, user_of, is_chall, (champion.version, challenger.version), t0_us, span_s, latency, list(orgs)
        )
        persisted = rng.random(count) < p_persist
        reverted = ~persisted & (rng.random(count) < 0.2)
        dissatisfied = rng.random(count) < p_dissat
        followup = dissatisfied | (rng.random(count) < 0.4)
        fb = _feedback(rng, events, offsets, t0_us, persisted, reverted, followup, dissatisfied)
        return events, fb

    window_s = (end - start).total_seconds()
    events, fb = block(n, start, window_s, all_champion=False)
    if pre_hours > 0 and pre_n > 0:
        pre_events, pre_fb = block(pre_n, start - timedelta(hours=pre_hours), pre_hours * 3600, all_champion=True)
        events, fb = pa.concat_tables([pre_events, events]), pa.concat_tables([pre_fb, fb])
    return events, fb
