"""Synthetic raw events for tests and benchmarks: realistic interactions + feedback at any volume.

Everything is drawn with numpy and assembled as Arrow arrays (no Python loop per row), so a million
interactions take seconds. Sessions of several turns, users pinned to an A/B arm by a stable draw, per-arm
outcome rates (edit persisted, dissatisfied follow-up, latency, broken tool calls, clarifying questions),
feedback arriving minutes to hours later (some after the grace period), and planted defects that the
data-quality gates must refuse: duplicated events, logprobs > 0 or NaN, a wrong model version, NaN latency.
The same arguments always write the same files (deterministic names), so generation is idempotent too.
The draws happen in one fixed order across the helpers below: tests compare exact numbers, so keep it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa

from lab.testing.columns import US, const, lists, pick, timestamps, uuids, write_to_lake
from lab.testing.texts import FOLLOWUPS_NEG, FOLLOWUPS_OK, PROMPTS, TOOLS, completion_pools, prompts_json
from rl_core.lake import Lake
from rl_core.schema import FEEDBACK_SCHEMA, INTERACTIONS_SCHEMA

VOCAB = 49152


@dataclass
class ArmSpec:
    """One A/B arm and the outcome rates of the version it serves."""

    name: str = "champion"
    model_version: int = 1
    share: float = 0.9  # of users
    edit_applied_p: float = 0.5  # of code answers
    edit_persisted_p: float = 0.6  # of applied edits
    edit_reverted_p: float = 0.15  # of applied edits
    dissatisfied_p: float = 0.15  # of follow-ups after a normal answer
    latency_ms: float = 900.0  # median
    tool_p: float = 0.2  # answers that call a tool
    broken_tool_p: float = 0.05  # of tool calls
    clarify_p: float = 0.06
    refusal_p: float = 0.01
    empty_p: float = 0.005
    thumbs_p: float = 0.05


DEFAULT_ARMS = (ArmSpec(), ArmSpec(name="challenger", model_version=2, share=0.1))
_RATES = ("edit_applied_p", "edit_persisted_p", "edit_reverted_p", "dissatisfied_p", "latency_ms", "tool_p",
          "broken_tool_p", "clarify_p", "refusal_p", "empty_p", "thumbs_p")


@dataclass
class Defects:
    """How many rows get each planted defect (0 = clean data)."""

    duplicate_events: int = 0  # interactions written a second time (same event_id) in another file
    positive_logprobs: int = 0  # a completion logprob > 0
    nan_logprobs: int = 0
    wrong_version: int = 0  # model_version no arm serves (wrong_version_value)
    nan_latency: int = 0
    wrong_version_value: int = 99


@dataclass
class SynthResult:
    n_interactions: int
    n_feedback: int
    interaction_files: list[str]
    feedback_files: list[str]
    planted: dict[str, list[str]] = field(default_factory=dict)  # defect -> event_ids


@dataclass
class _Traffic:
    """Who sent each interaction and when, as plain numpy columns in time order."""

    session: np.ndarray
    turn: np.ndarray
    last: np.ndarray  # last turn of its session
    user: np.ndarray
    arm: np.ndarray
    org_of_user: np.ndarray
    req: np.ndarray  # epoch us
    resp: np.ndarray
    latency: np.ndarray
    P: dict[str, np.ndarray]  # the rates of each row's arm

    @property
    def n_sessions(self) -> int:
        return int(self.session.max()) + 1


def generate(n_interactions: int, start: datetime, end: datetime, seed: int = 0, *, lake: Lake | str,
             arms: tuple[ArmSpec, ...] | list[ArmSpec] = DEFAULT_ARMS, defects: Defects | None = None,
             orgs: tuple[str, ...] = ("org-acme", "org-globex", "org-initech"), late_feedback_p: float = 0.02,
             grace_hours: float = 6.0) -> SynthResult:
    """Write n_interactions in [start, end) plus their feedback into the lake's raw partitions."""
    if n_interactions < 1:
        raise ValueError(f"n_interactions must be >= 1, got {n_interactions}")
    if start.tzinfo is None or end.tzinfo is None or end <= start:
        raise ValueError("start and end must be timezone-aware with start < end")
    shares = np.array([a.share for a in arms], dtype=float)
    if not len(arms) or shares.min() < 0 or shares.sum() <= 0:
        raise ValueError("arms: need at least one arm with share > 0")
    lake = Lake(lake) if isinstance(lake, str) else lake
    defects = defects or Defects()
    rng = np.random.default_rng(seed)

    tr = _traffic(rng, int(n_interactions), start, end, arms, orgs)
    kinds = _answer_kinds(rng, tr.P)
    inter, planted, spare = _interactions(rng, tr, kinds, arms, orgs, defects)
    fb = _feedback(rng, inter, tr, kinds, late_feedback_p, grace_hours)
    dup = np.sort(spare[:defects.duplicate_events])
    if len(dup):
        planted["duplicate_events"] = inter["event_id"].take(pa.array(dup)).to_pylist()
    ifiles = write_to_lake(lake, "interactions", inter, tag=f"synth-{seed}")
    if len(dup):
        ifiles += write_to_lake(lake, "interactions", inter.take(pa.array(dup)), tag=f"synth-{seed}-retry")
    ffiles = write_to_lake(lake, "feedback", fb, tag=f"synth-{seed}")
    return SynthResult(inter.num_rows + len(dup), fb.num_rows, ifiles, ffiles, planted)


def _sessions(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """session index, turn index and 'last turn of its session' for n interactions."""
    lengths = rng.geometric(1 / 3, size=n // 2 + 2)
    ends = np.cumsum(lengths)
    k = int(np.searchsorted(ends, n)) + 1
    lengths = lengths[:k].copy()
    lengths[-1] -= int(ends[k - 1] - n)
    session = np.repeat(np.arange(k), lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    turn = np.arange(n) - starts
    last = np.repeat(lengths - 1, lengths) == turn
    return session, turn, last


def _traffic(rng: np.random.Generator, n: int, start: datetime, end: datetime, arms, orgs) -> _Traffic:
    """Sessions -> users -> orgs, the arm pinned per user; sessions start uniformly in the window and turns follow
    a minute or two apart. Rows are put in time order here, while they are plain numpy columns, so no wide table
    has to be sorted later."""
    session, turn, last = _sessions(rng, n)
    n_sessions = int(session.max()) + 1
    n_users = max(1, n_sessions // 4)
    user = rng.integers(0, n_users, n_sessions)[session]
    org_w = 1.0 / np.arange(1, len(orgs) + 1)
    org_of_user = rng.choice(len(orgs), n_users, p=org_w / org_w.sum())
    shares = np.array([a.share for a in arms], dtype=float)
    arm_of_user = rng.choice(len(arms), n_users, p=shares / shares.sum())

    t0, span = int(start.timestamp() * US), int((end - start).total_seconds() * US)
    sess_start = rng.integers(0, span, n_sessions)
    req = t0 + np.minimum(sess_start[session] + turn * rng.integers(20, 180, n) * US, span - 1)
    order = np.argsort(req, kind="stable")
    session, turn, last, user, req = session[order], turn[order], last[order], user[order], req[order]
    arm = arm_of_user[user]
    P = {k: np.array([getattr(a, k) for a in arms])[arm] for k in _RATES}
    latency = rng.lognormal(np.log(P["latency_ms"]), 0.5)
    resp = req + (latency * 1000).astype(np.int64)
    return _Traffic(session, turn, last, user, arm, org_of_user, req, resp, latency, P)


def _answer_kinds(rng: np.random.Generator, P: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What each answer is (one uniform draw split by the arm's rates): the masks, and `kind` as an index into
    completion_pools() (0 code, 1 broken call, 2 call, 3 clarify, 4 refusal, 5 empty)."""
    n = len(P["tool_p"])
    u = rng.random(n)
    tool = u < P["tool_p"]
    broken = tool & (rng.random(n) < P["broken_tool_p"])
    c = u - P["tool_p"]
    clarify = ~tool & (c >= 0) & (c < P["clarify_p"])
    c = c - P["clarify_p"]
    refusal = ~tool & ~clarify & (c >= 0) & (c < P["refusal_p"])
    c = c - P["refusal_p"]
    empty = ~tool & ~clarify & ~refusal & (c >= 0) & (c < P["empty_p"])
    code = ~(tool | clarify | refusal | empty)
    kind = np.select([broken, tool, clarify, refusal, empty], [1, 2, 3, 4, 5], 0)
    return {"tool": tool, "broken": broken, "code": code, "bad_answer": clarify | refusal | empty, "kind": kind}


def _texts(rng: np.random.Generator, kind: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """(completion_text, tool_calls): a pool entry of each row's answer kind."""
    text_idx = np.zeros(len(kind), dtype=np.int64)
    comp_pool, call_pool = completion_pools()
    offsets = np.cumsum([0] + [len(p) for p in comp_pool])
    for k, pool in enumerate(comp_pool):
        m = kind == k
        text_idx[m] = offsets[k] + rng.integers(0, len(pool), int(m.sum()))
    flat = [t for pool in comp_pool for t in pool]
    flat_calls = [c for pool in call_pool for c in pool]
    return pick(flat, text_idx), pa.array(flat_calls, pa.string()).take(pa.array(text_idx))


def _token_ids(rng: np.random.Generator, lengths: np.ndarray) -> pa.Array:
    return lists(lengths, pa.array(rng.integers(0, VOCAB, int(lengths.sum()), dtype=np.int32)))


def _logprobs(rng: np.random.Generator, lengths: np.ndarray) -> pa.Array:
    """Sampled-token logprobs: <= 0, mostly near 0."""
    return lists(lengths, pa.array(-rng.exponential(0.6, int(lengths.sum())).astype(np.float32)))


def _interactions(rng: np.random.Generator, tr: _Traffic, kinds: dict, arms, orgs,
                  defects: Defects) -> tuple[pa.Table, dict[str, list[str]], np.ndarray]:
    """The interactions table with its planted defects, the planted event_ids, and the rows not yet picked for a
    defect (where the duplicates come from)."""
    n, tool = len(tr.req), kinds["tool"]
    completion_text, tool_calls = _texts(rng, kinds["kind"])
    prompt_idx = rng.integers(0, len(PROMPTS), n) * 2 + (tool | (rng.random(n) < 0.3))
    comp_len = rng.integers(4, 48, n)
    lengths_prompt = rng.integers(8, 64, n) + 12 * tr.turn.clip(0, 8)
    versions = np.array([a.model_version for a in arms], dtype=np.int64)[tr.arm]
    arm_names = np.array([a.name for a in arms], dtype=object)
    finish = np.where(tool, 1, np.where(rng.random(n) < 0.03, 2, 0))
    ids = uuids(rng, n)
    sess_ids = uuids(rng, tr.n_sessions).take(pa.array(tr.session))
    n_users = len(tr.org_of_user)
    user_ids = pa.array([f"user-{i:06d}" for i in range(n_users)]).take(pa.array(tr.user))
    logprobs, version, lat, planted, spare = _plant(rng, ids, _logprobs(rng, comp_len), versions, tr.latency,
                                                    defects)
    inter = pa.table({
        "event_id": ids,
        "org_id": pa.array(list(orgs)).take(pa.array(tr.org_of_user[tr.user])),
        "user_id": user_ids,
        "session_id": sess_ids,
        "turn_index": pa.array(tr.turn.astype(np.int32)),
        "ts_request": timestamps(tr.req),
        "ts_response": timestamps(tr.resp),
        "requested_model": const("auto", n),
        "model_version": pa.array(version),
        "adapter_version": pa.nulls(n, pa.string()),
        "arm": pa.array(arm_names[tr.arm].tolist()),
        "messages": pick(prompts_json(PROMPTS), prompt_idx),
        "prompt_token_ids": _token_ids(rng, lengths_prompt),
        "completion_token_ids": _token_ids(rng, comp_len),
        "completion_logprobs": logprobs,
        "completion_text": completion_text,
        "tool_calls": tool_calls,
        "finish_reason": pa.array(["stop", "tool_calls", "length"]).take(pa.array(finish)),
        "latency_ms": pa.array(lat),
        "ttft_ms": pa.array(lat * 0.2),
        "temperature": pa.array(np.full(n, 0.7, dtype=np.float32)),
        "top_p": pa.array(np.full(n, 0.95, dtype=np.float32)),
    }).cast(INTERACTIONS_SCHEMA)
    return inter, planted, spare


def _plant(rng: np.random.Generator, ids: pa.Array, logprobs: pa.Array, versions: np.ndarray, latency: np.ndarray,
           defects: Defects):
    """Plant each defect on its own random rows. Returns the edited (logprobs, versions, latency), the planted
    event_ids by defect, and the rows no defect took."""
    planted: dict[str, list[str]] = {}
    picks = rng.permutation(len(ids))
    pos = 0
    versions, latency = versions.copy(), latency.copy()
    lp_vals = logprobs.values.to_numpy(zero_copy_only=False).copy()
    lp_off = logprobs.offsets.to_numpy()
    for name, count in (("positive_logprobs", defects.positive_logprobs), ("nan_logprobs", defects.nan_logprobs),
                        ("wrong_version", defects.wrong_version), ("nan_latency", defects.nan_latency)):
        if count:
            sel = np.sort(picks[pos:pos + count])
            pos += count
            if name == "positive_logprobs":
                lp_vals[lp_off[sel]] = 0.5
            elif name == "nan_logprobs":
                lp_vals[lp_off[sel]] = np.nan
            elif name == "wrong_version":
                versions[sel] = defects.wrong_version_value
            else:
                latency[sel] = np.nan
            planted[name] = ids.take(pa.array(sel)).to_pylist()
    logprobs = pa.ListArray.from_arrays(logprobs.offsets, pa.array(lp_vals))
    return logprobs, versions, latency, planted, picks[pos:]


def _feedback(rng: np.random.Generator, inter: pa.Table, tr: _Traffic, kinds: dict, late_p: float,
              grace_hours: float) -> pa.Table:
    """Feedback events for the interactions, as one Arrow table (kinds drawn with vectorised masks)."""
    n, P, resp, last = inter.num_rows, tr.P, tr.resp, tr.last
    code, tool, broken = kinds["code"], kinds["tool"], kinds["broken"]
    parts: list[tuple[np.ndarray, str, np.ndarray, np.ndarray | None, np.ndarray | None, pa.Array | None]] = []
    hour = 3600 * US

    # follow-up message: always when the session goes on, sometimes after its last turn
    has_follow = ~last | (rng.random(n) < 0.3)
    dis_p = np.where(kinds["bad_answer"] | broken, np.maximum(P["dissatisfied_p"], 0.6), P["dissatisfied_p"])
    dissatisfied = rng.random(n) < dis_p
    idx = np.flatnonzero(has_follow)
    neg, neu = (FOLLOWUPS_NEG, FOLLOWUPS_OK)
    choice = np.where(dissatisfied[idx], rng.integers(0, len(neg), len(idx)),
                      len(neg) + rng.integers(0, len(neu), len(idx)))
    parts.append((idx, "followup_message", resp[idx] + rng.integers(5, 120, len(idx)) * US, None, None,
                  pick(neg + neu, choice)))

    # edits: applied, then persisted (hours observed) or reverted; some outcomes arrive after the grace period
    applied = code & (rng.random(n) < P["edit_applied_p"])
    r = rng.random(n)
    reverted = applied & (r < P["edit_reverted_p"])
    persisted = applied & ~reverted & (r < P["edit_reverted_p"] + P["edit_persisted_p"])
    idx = np.flatnonzero(applied)
    parts.append((idx, "edit_applied", resp[idx] + rng.integers(2, 60, len(idx)) * US, None, None, None))
    idx = np.flatnonzero(persisted)
    hours = rng.uniform(1, 4, len(idx))
    late = rng.random(len(idx)) < late_p
    delay = np.where(late, (grace_hours + 24) * hour, (hours * hour).astype(np.int64))
    parts.append((idx, "edit_persisted", resp[idx] + delay, None, np.round(hours, 2), None))
    idx = np.flatnonzero(reverted)
    parts.append((idx, "edit_reverted", resp[idx] + rng.integers(60, 3600, len(idx)) * US, None, None, None))

    # tool results: broken calls always fail
    idx = np.flatnonzero(tool)
    ok = ~broken[idx] & (rng.random(len(idx)) < 0.9)
    parts.append((idx, "tool_result", resp[idx] + rng.integers(1, 10, len(idx)) * US, ok, None, None))

    # thumbs, mostly down after a dissatisfied follow-up
    idx = np.flatnonzero(rng.random(n) < P["thumbs_p"])
    up = np.where(dissatisfied[idx], rng.random(len(idx)) < 0.1, rng.random(len(idx)) < 0.8)
    parts.append((idx, "thumbs", resp[idx] + rng.integers(5, 300, len(idx)) * US, up, None, None))

    idx = np.flatnonzero(last & (rng.random(n) < 0.5))  # not every client reports the end
    parts.append((idx, "session_end", resp[idx] + 600 * US, None, None, None))
    return _feedback_table(rng, inter, parts)


def _feedback_table(rng: np.random.Generator, inter: pa.Table, parts: list[tuple]) -> pa.Table:
    """Feedback parts (rows, kind, ts, value_bool, value_float, text; None = null) -> one FEEDBACK_SCHEMA table."""
    rows = np.concatenate([p[0] for p in parts])
    kinds = pa.array([p[1] for p in parts]).take(pa.array(np.repeat(np.arange(len(parts)), [len(p[0]) for p in parts])))

    def col(i: int, dtype) -> pa.Array:
        chunks = [p[i] if p[i] is not None else pa.nulls(len(p[0]), dtype) for p in parts]
        return pa.concat_arrays([c if isinstance(c, pa.Array) else pa.array(c, dtype) for c in chunks])

    return pa.table({
        "feedback_id": uuids(rng, len(rows)),
        "event_id": inter["event_id"].take(pa.array(rows)),
        "org_id": inter["org_id"].take(pa.array(rows)),
        "ts": timestamps(np.concatenate([p[2] for p in parts])),
        "kind": kinds,
        "value_bool": col(3, pa.bool_()),
        "value_float": col(4, pa.float64()),
        "text": col(5, pa.string()),
    }).cast(FEEDBACK_SCHEMA)


def interaction_row(ts: datetime, **overrides) -> dict:
    """One hand-made interaction row (contract columns, sensible defaults) for tests of a specific case."""
    n = len(overrides.get("completion_token_ids", [1, 2, 3]))
    row = {"event_id": str(uuid.uuid4()), "org_id": "org-acme", "user_id": "user-1", "session_id": "s-1",
           "turn_index": 0, "ts_request": ts, "ts_response": ts + timedelta(seconds=1), "requested_model": "auto",
           "model_version": 1, "adapter_version": None, "arm": "champion",
           "messages": json.dumps({"messages": [{"role": "user", "content": "fix it"}], "tools": TOOLS}),
           "prompt_token_ids": [5, 6, 7], "completion_token_ids": [1, 2, 3], "completion_logprobs": [-0.5] * n,
           "completion_text": "Done: changed `range(n - 1)` to `range(n)`.", "tool_calls": None,
           "finish_reason": "stop", "latency_ms": 800.0, "ttft_ms": 100.0, "temperature": 0.7, "top_p": 0.95}
    return row | overrides


def feedback_row(event: dict, kind: str, delay: timedelta = timedelta(minutes=1), **overrides) -> dict:
    """One hand-made feedback row about an interaction row."""
    row = {"feedback_id": str(uuid.uuid4()), "event_id": event["event_id"], "org_id": event["org_id"],
           "ts": event["ts_response"] + delay, "kind": kind, "value_bool": None, "value_float": None, "text": None}
    return row | overrides


def window(hours: float = 5.0, end: datetime | None = None) -> tuple[datetime, datetime]:
    """A convenient [start, end) ending on an hour boundary (default: 2026-12-02T10:00Z)."""
    end = end or datetime(2026, 12, 2, 10, tzinfo=timezone.utc)
    return end - timedelta(hours=hours), end
