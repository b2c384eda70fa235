"""Synthetic raw events for tests and benchmarks: realistic interactions + feedback at any volume.

Everything is drawn with numpy and assembled as Arrow arrays (no Python loop per row), so a million
interactions take seconds. Sessions of several turns, users pinned to an A/B arm by a stable draw, per-arm
outcome rates (edit persisted, dissatisfied follow-up, latency, broken tool calls, clarifying questions),
feedback arriving minutes to hours later (some after the grace period), and planted defects that the
data-quality gates must refuse: duplicated events, logprobs > 0 or NaN, a wrong model version, NaN latency.
The same arguments always write the same files (deterministic names), so generation is idempotent too.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa

from rl_core.harvest import write_table
from rl_core.lake import Lake
from rl_core.schema import FEEDBACK_SCHEMA, INTERACTIONS_SCHEMA

VOCAB = 49152
_US = 1_000_000


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


def _uuids(rng: np.random.Generator, n: int) -> pa.Array:
    """n random UUID4 strings built as one byte buffer (no per-row Python)."""
    b = rng.integers(0, 256, (n, 16), dtype=np.uint8)
    b[:, 6] = (b[:, 6] & 0x0F) | 0x40
    b[:, 8] = (b[:, 8] & 0x3F) | 0x80
    lut = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    h = np.empty((n, 32), dtype=np.uint8)
    h[:, 0::2], h[:, 1::2] = lut[b >> 4], lut[b & 15]
    out = np.full((n, 36), ord("-"), dtype=np.uint8)
    for src, dst in ((slice(0, 8), slice(0, 8)), (slice(8, 12), slice(9, 13)), (slice(12, 16), slice(14, 18)),
                     (slice(16, 20), slice(19, 23)), (slice(20, 32), slice(24, 36))):
        out[:, dst] = h[:, src]
    offsets = np.arange(0, 36 * n + 1, 36, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(out.tobytes()))


def _lists(rng: np.random.Generator, lengths: np.ndarray, kind: str) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if kind == "ids":
        values = pa.array(rng.integers(0, VOCAB, total, dtype=np.int32))
    else:  # sampled-token logprobs: <= 0, mostly near 0
        values = pa.array(-rng.exponential(0.6, total).astype(np.float32))
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _ts(us: np.ndarray) -> pa.Array:
    return pa.array(us.astype("datetime64[us]"), type=pa.timestamp("us")).cast(pa.timestamp("us", tz="UTC"))


def _pick(pool: list[str], idx: np.ndarray) -> pa.Array:
    return pa.array(pool, pa.string()).take(pa.array(idx))


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
    n = int(n_interactions)

    # who: sessions -> users -> orgs, arm pinned per user
    session, turn, last = _sessions(rng, n)
    n_sessions = int(session.max()) + 1
    n_users = max(1, n_sessions // 4)
    user_of_session = rng.integers(0, n_users, n_sessions)
    user = user_of_session[session]
    org_w = 1.0 / np.arange(1, len(orgs) + 1)
    org_of_user = rng.choice(len(orgs), n_users, p=org_w / org_w.sum())
    arm_of_user = rng.choice(len(arms), n_users, p=shares / shares.sum())

    # when: sessions start uniformly in the window; turns follow a minute or two apart. Rows are put in
    # time order now, while they are plain numpy columns, so no wide table has to be sorted later.
    t0, span = int(start.timestamp() * _US), int((end - start).total_seconds() * _US)
    sess_start = rng.integers(0, span, n_sessions)
    req = t0 + np.minimum(sess_start[session] + turn * rng.integers(20, 180, n) * _US, span - 1)
    order = np.argsort(req, kind="stable")
    session, turn, last, user, req = session[order], turn[order], last[order], user[order], req[order]
    arm = arm_of_user[user]
    P = {k: np.array([getattr(a, k) for a in arms])[arm] for k in (
        "edit_applied_p", "edit_persisted_p", "edit_reverted_p", "dissatisfied_p", "latency_ms", "tool_p",
        "broken_tool_p", "clarify_p", "refusal_p", "empty_p", "thumbs_p")}
    latency = rng.lognormal(np.log(P["latency_ms"]), 0.5)
    resp = req + (latency * 1000).astype(np.int64)

    # what: answer kind decides the text, tool calls and follow-ups
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

    text_idx = np.zeros(n, dtype=np.int64)
    comp_pool, call_pool = completion_pools()
    offsets = np.cumsum([0] + [len(p) for p in comp_pool])
    for k, pool in enumerate(comp_pool):
        m = kind == k
        text_idx[m] = offsets[k] + rng.integers(0, len(pool), int(m.sum()))
    flat = [t for pool in comp_pool for t in pool]
    flat_calls = [c for pool in call_pool for c in pool]
    prompts = PROMPTS
    prompt_idx = rng.integers(0, len(prompts), n) * 2 + (tool | (rng.random(n) < 0.3))

    comp_len = rng.integers(4, 48, n)
    lengths_prompt = rng.integers(8, 64, n) + 12 * turn.clip(0, 8)
    temperature = np.full(n, 0.7, dtype=np.float32)
    versions = np.array([a.model_version for a in arms], dtype=np.int64)[arm]
    arm_names = np.array([a.name for a in arms], dtype=object)
    finish = np.where(tool, 1, np.where(rng.random(n) < 0.03, 2, 0))

    ids = _uuids(rng, n)
    sess_ids = _uuids(rng, n_sessions).take(pa.array(session))
    user_ids = pa.array([f"user-{i:06d}" for i in range(n_users)]).take(pa.array(user))
    lat = latency.copy()
    version_col = versions.copy()
    logprobs = _lists(rng, comp_len, "logprobs")

    # planted defects
    planted: dict[str, list[str]] = {}
    picks = rng.permutation(n)
    pos = 0

    def take(count: int) -> np.ndarray:
        nonlocal pos
        sel = np.sort(picks[pos:pos + count])
        pos += count
        return sel

    lp_vals = logprobs.values.to_numpy(zero_copy_only=False).copy()
    lp_off = logprobs.offsets.to_numpy()
    for name, count in (("positive_logprobs", defects.positive_logprobs), ("nan_logprobs", defects.nan_logprobs),
                        ("wrong_version", defects.wrong_version), ("nan_latency", defects.nan_latency)):
        if count:
            sel = take(count)
            if name == "positive_logprobs":
                lp_vals[lp_off[sel]] = 0.5
            elif name == "nan_logprobs":
                lp_vals[lp_off[sel]] = np.nan
            elif name == "wrong_version":
                version_col[sel] = defects.wrong_version_value
            else:
                lat[sel] = np.nan
            planted[name] = ids.take(pa.array(sel)).to_pylist()
    logprobs = pa.ListArray.from_arrays(logprobs.offsets, pa.array(lp_vals))

    inter = pa.table({
        "event_id": ids,
        "org_id": pa.array(list(orgs)).take(pa.array(org_of_user[user])),
        "user_id": user_ids,
        "session_id": sess_ids,
        "turn_index": pa.array(turn.astype(np.int32)),
        "ts_request": _ts(req),
        "ts_response": _ts(resp),
        "requested_model": pa.array(["auto"]).take(pa.array(np.zeros(n, dtype=np.int64))),
        "model_version": pa.array(version_col),
        "adapter_version": pa.nulls(n, pa.string()),
        "arm": pa.array(arm_names[arm].tolist()),
        "messages": _pick(prompts_json(prompts), prompt_idx),
        "prompt_token_ids": _lists(rng, lengths_prompt, "ids"),
        "completion_token_ids": _lists(rng, comp_len, "ids"),
        "completion_logprobs": logprobs,
        "completion_text": _pick(flat, text_idx),
        "tool_calls": pa.array(flat_calls, pa.string()).take(pa.array(text_idx)),
        "finish_reason": pa.array(["stop", "tool_calls", "length"]).take(pa.array(finish)),
        "latency_ms": pa.array(lat),
        "ttft_ms": pa.array(lat * 0.2),
        "temperature": pa.array(temperature),
        "top_p": pa.array(np.full(n, 0.95, dtype=np.float32)),
    }).cast(INTERACTIONS_SCHEMA)

    fb = _feedback(rng, inter, resp, P, kind, code, tool, broken, clarify | refusal | empty, last,
                   late_feedback_p, grace_hours, end)
    dup = take(defects.duplicate_events) if defects.duplicate_events else np.array([], dtype=np.int64)
    if len(dup):
        planted["duplicate_events"] = ids.take(pa.array(dup)).to_pylist()
    ifiles = _write(lake, "interactions", inter, req, f"synth-{seed}")
    if len(dup):
        ifiles += _write(lake, "interactions", inter.take(pa.array(dup)), req[dup], f"synth-{seed}-retry")
    ffiles = _write(lake, "feedback", fb, _us(fb["ts"]), f"synth-{seed}")
    return SynthResult(n + len(dup), fb.num_rows, ifiles, ffiles, planted)


def prompts_json(prompts: list[str]) -> list[str]:
    """Each prompt twice: plain messages, then messages + tools (the serving's {"messages", "tools"} JSON)."""
    out = []
    for p in prompts:
        msgs = [{"role": "system", "content": "You are a helpful coding assistant."}, {"role": "user", "content": p}]
        out.append(json.dumps({"messages": msgs}))
        out.append(json.dumps({"messages": msgs, "tools": TOOLS}))
    return out


def _us(col: pa.ChunkedArray) -> np.ndarray:
    return col.cast(pa.timestamp("us")).cast(pa.int64()).to_numpy()


def _feedback(rng, inter: pa.Table, resp: np.ndarray, P: dict, kind, code, tool, broken, bad_answer, last,
              late_p: float, grace_hours: float, end: datetime) -> pa.Table:
    """Feedback events for the interactions, as one Arrow table (kinds drawn with vectorised masks)."""
    n = inter.num_rows
    parts: list[tuple[np.ndarray, str, np.ndarray, np.ndarray | None, np.ndarray | None, pa.Array | None]] = []
    hour = 3600 * _US

    # follow-up message: always when the session goes on, sometimes after its last turn
    has_follow = ~last | (rng.random(n) < 0.3)
    dis_p = np.where(bad_answer | broken, np.maximum(P["dissatisfied_p"], 0.6), P["dissatisfied_p"])
    dissatisfied = rng.random(n) < dis_p
    idx = np.flatnonzero(has_follow)
    neg, neu = (FOLLOWUPS_NEG, FOLLOWUPS_OK)
    pool = neg + neu
    choice = np.where(dissatisfied[idx], rng.integers(0, len(neg), len(idx)),
                      len(neg) + rng.integers(0, len(neu), len(idx)))
    parts.append((idx, "followup_message", resp[idx] + rng.integers(5, 120, len(idx)) * _US, None, None,
                  _pick(pool, choice)))

    # edits: applied, then persisted (hours observed) or reverted; some outcomes arrive after the grace period
    applied = code & (rng.random(n) < P["edit_applied_p"])
    r = rng.random(n)
    reverted = applied & (r < P["edit_reverted_p"])
    persisted = applied & ~reverted & (r < P["edit_reverted_p"] + P["edit_persisted_p"])
    idx = np.flatnonzero(applied)
    parts.append((idx, "edit_applied", resp[idx] + rng.integers(2, 60, len(idx)) * _US, None, None, None))
    idx = np.flatnonzero(persisted)
    hours = rng.uniform(1, 4, len(idx))
    late = rng.random(len(idx)) < late_p
    delay = np.where(late, (grace_hours + 24) * hour, (hours * hour).astype(np.int64))
    parts.append((idx, "edit_persisted", resp[idx] + delay, None, np.round(hours, 2), None))
    idx = np.flatnonzero(reverted)
    parts.append((idx, "edit_reverted", resp[idx] + rng.integers(60, 3600, len(idx)) * _US, None, None, None))

    # tool results: broken calls always fail
    idx = np.flatnonzero(tool)
    ok = ~broken[idx] & (rng.random(len(idx)) < 0.9)
    parts.append((idx, "tool_result", resp[idx] + rng.integers(1, 10, len(idx)) * _US, ok, None, None))

    # thumbs, mostly down after a dissatisfied follow-up
    idx = np.flatnonzero(rng.random(n) < P["thumbs_p"])
    up = np.where(dissatisfied[idx], rng.random(len(idx)) < 0.1, rng.random(len(idx)) < 0.8)
    parts.append((idx, "thumbs", resp[idx] + rng.integers(5, 300, len(idx)) * _US, up, None, None))

    idx = np.flatnonzero(last & (rng.random(n) < 0.5))  # not every client reports the end
    parts.append((idx, "session_end", resp[idx] + 600 * _US, None, None, None))

    rows = np.concatenate([p[0] for p in parts])
    m = len(rows)
    kinds = pa.array([p[1] for p in parts]).take(pa.array(np.repeat(np.arange(len(parts)), [len(p[0]) for p in parts])))

    def col(i: int, dtype) -> pa.Array:
        chunks = [p[i] if p[i] is not None else pa.nulls(len(p[0]), dtype) for p in parts]
        return pa.concat_arrays([c if isinstance(c, pa.Array) else pa.array(c, dtype) for c in chunks])

    return pa.table({
        "feedback_id": _uuids(rng, m),
        "event_id": inter["event_id"].take(pa.array(rows)),
        "org_id": inter["org_id"].take(pa.array(rows)),
        "ts": _ts(np.concatenate([p[2] for p in parts])),
        "kind": kinds,
        "value_bool": col(3, pa.bool_()),
        "value_float": col(4, pa.float64()),
        "text": col(5, pa.string()),
    }).cast(FEEDBACK_SCHEMA)


def _write(lake: Lake, table_name: str, table: pa.Table, ts_us: np.ndarray, prefix: str) -> list[str]:
    """One file per hour partition, sorted by time, with deterministic names (reruns overwrite)."""
    if len(ts_us) > 1 and not np.all(ts_us[1:] >= ts_us[:-1]):
        order = np.argsort(ts_us, kind="stable")
        table, ts_us = table.take(pa.array(order)), ts_us[order]
    hours = ts_us // (3600 * _US)
    bounds = np.flatnonzero(np.diff(hours)) + 1
    files = []
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(hours)], strict=True):
        h = datetime.fromtimestamp(int(hours[lo]) * 3600, tz=timezone.utc)
        files.append(write_table(lake, f"{lake.partition(table_name, h)}/{prefix}.parquet", table.slice(lo, hi - lo)))
    return files


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


# --- text pools (short, realistic shapes; the classifiers are evaluated on tests/data, not on these) ------

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {"name": "run_tests", "description": "Run the test suite",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "k": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "apply_patch", "description": "Apply a unified diff",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "diff": {"type": "string"}},
                    "required": ["path", "diff"]}}},
]

PROMPTS = [
    "Fix the off-by-one error in utils/paginate.py", "Why does this test fail with KeyError: 'id'?",
    "Add type hints to the parse_config function", "Write a unit test for the retry decorator",
    "Refactor this loop into a list comprehension", "How do I read a CSV with pandas and skip bad lines?",
    "Rename the variable tmp to buffer everywhere in this file", "Make this function async",
    "The CI says ruff found unused imports, fix them", "Explain what this regex does: ^\\d{3}-\\w+$",
    "Add a --verbose flag to the CLI", "Why is my Dockerfile rebuilding every time?",
    "Convert this callback code to use promises", "Speed up this SQL query, it scans the whole table",
    "Add logging to the payment handler", "Write a docstring for this class",
]

FOLLOWUPS_NEG = [
    "that's wrong, it still fails", "no, this doesn't work", "you broke the build", "still getting the same error",
    "that is not what I asked", "ugh, revert that", "this is useless", "why did you delete my function?",
    "wrong file", "it doesn't compile now", "nope, same KeyError", "stop changing unrelated code",
]
FOLLOWUPS_OK = [
    "thanks, that works", "great, now add a test for it", "perfect", "ok, can you also update the README?",
    "looks good, what about the edge case when the list is empty?", "nice, next rename the module",
    "cool. how do I run it locally?", "now do the same for the other handler", "thank you!",
    "and can you make it faster?", "makes sense", "what does the second argument do?",
]


def _call(name: str, args) -> tuple[str, str]:
    raw = json.dumps({"name": name, "arguments": args})
    calls = [{"id": "call_0", "type": "function",
              "function": {"name": name, "arguments": json.dumps(args) if not isinstance(args, str) else args}}]
    return f"<tool_call>{raw}</tool_call>", json.dumps(calls)


def completion_pools() -> tuple[list[list[str]], list[list[str | None]]]:
    """Completion texts and their tool_calls JSON by answer kind: code, broken call, call, clarify, refusal, empty."""
    code = [
        "Here is the fix:\n```python\nfor i in range(len(items)):\n    yield items[i]\n```",
        "The loop stops one element early. Change `range(n - 1)` to `range(n)`.",
        "```python\ndef parse_config(path: str) -> dict[str, str]:\n    ...\n```\nThis adds the hints.",
        "Use `pd.read_csv(path, on_bad_lines='skip')`.",
        "```python\n@retry(times=3)\ndef flaky():\n    raise IOError\n\ndef test_retry():\n    ...\n```",
        "Add an index on `orders(customer_id)`; the query then uses an index scan.",
    ]
    broken_text = ['<tool_call>{"name": "read_file", "arguments": {"path": </tool_call>',
                   '<tool_call>{"name": "run_tests" "arguments": {}}</tool_call>']
    broken_calls = [json.dumps([{"id": "call_0", "type": "function", "function": {"name": "__invalid__",
                                                                                  "arguments": t[11:-12]}}])
                    for t in broken_text]
    schema_broken = [_call("read_file", {"file": "a.py"}), _call("apply_patch", {"path": 3, "diff": "-x"}),
                     _call("delete_repo", {"name": "x"})]
    valid = [_call("read_file", {"path": "src/app.py"}), _call("run_tests", {"path": "tests/", "k": "retry"}),
             _call("apply_patch", {"path": "utils/paginate.py", "diff": "@@ -1 +1 @@\n-a\n+b"}),
             _call("run_tests", {})]
    clarify = ["Which file do you mean, utils/paginate.py or api/paginate.py?",
               "Could you share the full traceback?", "Do you want me to keep the old behaviour as well?",
               "What Python version are you on?"]
    refusal = ["I'm sorry, but I can't help with that.", "I cannot assist with this request.",
               "As an AI language model, I am unable to do that."]
    texts = [code, broken_text + [t for t, _ in schema_broken], [t for t, _ in valid], clarify, refusal, [""]]
    calls = [[None] * len(code), broken_calls + [c for _, c in schema_broken], [c for _, c in valid],
             [None] * len(clarify), [None] * len(refusal), [None]]
    return texts, calls
