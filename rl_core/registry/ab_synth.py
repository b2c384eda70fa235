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

import binascii
import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rl_core.lake import Lake
from rl_core.schema import FEEDBACK_SCHEMA, INTERACTIONS_SCHEMA, TS

DISSATISFIED_TEXTS = (
    "that's wrong, it still fails",
    "this doesn't work",
    "no, that is not what i asked",
    "still broken after your change",
    "wrong file, try again",
)
NEUTRAL_TEXTS = (
    "thanks, now add a test for it",
    "great. next rename the helper",
    "ok, also update the docstring",
    "looks good, can you explain this part?",
)


@dataclass
class ArmSpec:
    """What one arm does on average: rates per interaction and latency (lognormal around the median)."""

    version: int
    edit_persisted: float = 0.30
    dissatisfied: float = 0.10
    latency_median_ms: float = 800.0
    latency_sigma: float = 0.5


def _uuids(rng: np.random.Generator, n: int) -> pa.Array:
    """n random UUID-4 strings, vectorised (hex of random bytes with dashes and version bits)."""
    hexed = np.frombuffer(binascii.hexlify(rng.bytes(16 * n)), dtype=np.uint8).reshape(n, 32)
    out = np.empty((n, 36), dtype=np.uint8)
    out[:, [8, 13, 18, 23]] = ord("-")
    cols = [c for c in range(36) if c not in (8, 13, 18, 23)]
    out[:, cols] = hexed
    out[:, 14] = ord("4")
    out[:, 19] = np.frombuffer(b"89ab", dtype=np.uint8)[rng.integers(0, 4, n)]
    return pa.array(out.view("S36").ravel().astype(str))


def _const(value, n: int, type_=None) -> pa.Array:
    return pa.array([value], type=type_).take(pa.array(np.zeros(n, dtype=np.int64)))


def _lists(values: list, n: int, type_) -> pa.Array:
    k = len(values)
    return pa.ListArray.from_arrays(
        pa.array(np.arange(0, k * n + 1, k, dtype=np.int32)), pa.array(np.tile(values, n), type=type_)
    )


def _ts(base: datetime, offsets_us: np.ndarray) -> pa.Array:
    epoch = int(base.timestamp() * 1_000_000)
    return pa.array(epoch + offsets_us.astype(np.int64), type=pa.int64()).cast(TS)


def _interactions(rng, n, users, user_of, arm_is_chall, version_of_arm, t0, span_s, latency, orgs):
    user_ids = pa.array([f"user-{u:06d}" for u in range(users)])
    uid = user_ids.take(pa.array(user_of))
    offsets = np.sort(rng.integers(0, int(span_s * 1e6), n))
    ts_req = _ts(t0, offsets)
    ts_resp = _ts(t0, offsets + (latency * 1000).astype(np.int64))
    arm = pa.array(np.where(arm_is_chall, "challenger", "champion"))
    table = pa.table(
        {
            "event_id": _uuids(rng, n),
            "org_id": pa.array(orgs).take(pa.array(user_of % len(orgs))),
            "user_id": uid,
            "session_id": pc.binary_join_element_wise(_const("sess", n, pa.string()), uid, "-"),
            "turn_index": pa.array(np.zeros(n, dtype=np.int32)),
            "ts_request": ts_req,
            "ts_response": ts_resp,
            "requested_model": _const("auto", n),
            "model_version": pa.array(np.where(arm_is_chall, version_of_arm[1], version_of_arm[0]).astype(np.int64)),
            "adapter_version": pa.nulls(n, pa.string()),
            "arm": arm,
            "messages": _const(json.dumps([{"role": "user", "content": "fix the failing test"}]), n),
            "prompt_token_ids": _lists([1, 2, 3], n, pa.int32()),
            "completion_token_ids": _lists([4, 5], n, pa.int32()),
            "completion_logprobs": _lists([-0.5, -0.25], n, pa.float32()),
            "completion_text": _const("Here is the fix.", n),
            "tool_calls": pa.nulls(n, pa.string()),
            "finish_reason": _const("stop", n),
            "latency_ms": pa.array(latency),
            "ttft_ms": pa.array(latency * 0.2),
            "temperature": _const(0.7, n, pa.float32()),
            "top_p": _const(1.0, n, pa.float32()),
        }
    )
    return table.cast(INTERACTIONS_SCHEMA), offsets


def _feedback(rng, events: pa.Table, offsets_us, t0, persisted, reverted, followup, dissatisfied) -> pa.Table:
    parts = []

    def add(mask, kind, value_bool=None, value_float=None, texts=None, delay_min=30.0):
        idx = np.flatnonzero(mask)
        m = len(idx)
        if m == 0:
            return
        delay = (rng.exponential(delay_min, m) * 60e6).astype(np.int64)
        text = pa.nulls(m, pa.string())
        if texts is not None:
            text = pa.array(texts).take(pa.array(rng.integers(0, len(texts), m)))
        parts.append(
            pa.table(
                {
                    "feedback_id": _uuids(rng, m),
                    "event_id": events["event_id"].take(pa.array(idx)),
                    "org_id": events["org_id"].take(pa.array(idx)),
                    "ts": _ts(t0, offsets_us[idx] + delay),
                    "kind": _const(kind, m),
                    "value_bool": pa.nulls(m, pa.bool_()) if value_bool is None else _const(value_bool, m),
                    "value_float": pa.nulls(m, pa.float64()) if value_float is None else _const(value_float, m),
                    "text": text,
                }
            ).cast(FEEDBACK_SCHEMA)
        )

    add(persisted | reverted, "edit_applied", delay_min=2.0)
    add(persisted, "edit_persisted", value_float=24.0, delay_min=60.0)
    add(reverted, "edit_reverted", delay_min=20.0)
    add(followup & dissatisfied, "followup_message", texts=DISSATISFIED_TEXTS, delay_min=3.0)
    add(followup & ~dissatisfied, "followup_message", texts=NEUTRAL_TEXTS, delay_min=3.0)
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
        user_of = rng.choice(users, size=count, p=activity / activity.sum())
        is_chall = np.zeros(count, dtype=bool) if all_champion else chall_user[user_of]
        spec = lambda a, b: np.where(is_chall, b, a)  # noqa: E731
        p_persist = np.clip(spec(champion.edit_persisted, challenger.edit_persisted) + off_persist[user_of], 0, 1)
        p_dissat = np.clip(spec(champion.dissatisfied, challenger.dissatisfied) + off_dissat[user_of], 0, 1)
        median = spec(champion.latency_median_ms, challenger.latency_median_ms)
        sigma = spec(champion.latency_sigma, challenger.latency_sigma)
        latency = median * np.exp(off_lat[user_of] + sigma * rng.standard_normal(count))
        events, offsets = _interactions(
            rng, count, users, user_of, is_chall, (champion.version, challenger.version), t0, span_s, latency, list(orgs)
        )
        persisted = rng.random(count) < p_persist
        reverted = ~persisted & (rng.random(count) < 0.2)
        dissatisfied = rng.random(count) < p_dissat
        followup = dissatisfied | (rng.random(count) < 0.4)
        fb = _feedback(rng, events, offsets, t0, persisted, reverted, followup, dissatisfied)
        return events, fb

    window_s = (end - start).total_seconds()
    events, fb = block(n, start, window_s, all_champion=False)
    if pre_hours > 0 and pre_n > 0:
        pre_events, pre_fb = block(pre_n, start - timedelta(hours=pre_hours), pre_hours * 3600, all_champion=True)
        events, fb = pa.concat_tables([pre_events, events]), pa.concat_tables([pre_fb, fb])
    return events, fb


def write_to_lake(lake: Lake, table_name: str, table: pa.Table, tag: str = "ab-synth") -> list[str]:
    """Write rows into their hour partitions (one file per hour; the same tag overwrites the same file)."""
    col = "ts_request" if table_name == "interactions" else "ts"
    hours = pc.divide(pc.cast(pc.cast(table[col], pa.int64()), pa.int64()), 3_600_000_000).to_numpy()
    order = np.argsort(hours, kind="stable")
    table, hours = table.take(pa.array(order)), hours[order]
    paths = []
    bounds = np.flatnonzero(np.diff(hours)) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(hours)], strict=True):
        ts = datetime.fromtimestamp(int(hours[lo]) * 3600, tz=timezone.utc)
        paths.append(lake.write_partition(table_name, ts, table.slice(lo, hi - lo), name=f"{tag}.parquet"))
    return paths
