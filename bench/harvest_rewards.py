"""Benchmark: harvest + rewards over N synthetic interactions with feedback, versus plain pandas.

    .venv/bin/python bench/harvest_rewards.py [--n 1000000] [--pandas-n 200000] [--repeat 3]

Generates a window of raw events with lab.testing.synth (not timed), then times rtrl's path
(DuckDB over the Parquet lake + Arrow-batch scorers, written atomically) and a plain-pandas implementation
of the same selection, join, aggregation and signals (row-wise apply where pandas has nothing better,
as one would write it), on the same data. The pandas rewards are checked against rtrl's (max |diff|).
It also times the I/O floor at the pandas size: what any implementation that writes these episodes as
Parquet with Arrow must spend (read the lake's columns, write the episodes uncompressed, read back what the
scorers need), against the budget a 10x speed-up over pandas leaves. Prints markdown tables; the pandas run
uses a subset by default (a million rows of token lists in pandas objects would exceed this machine's
per-process memory share), so the ratio compares rates at equal size.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.testing.synth import generate, window  # noqa: E402
from rl_core.config import load_config  # noqa: E402
from rl_core.harvest import harvest  # noqa: E402
from rl_core.lake import Lake  # noqa: E402
from rl_core.rewards import SIGNALS, followup, score_run, scorers  # noqa: E402

POLICY = 2


def rtrl_path(cfg, start, end, run_id: str) -> tuple[float, float, pd.Series]:
    t0 = time.perf_counter()
    harvest(cfg, start, end, POLICY, run_id)
    t1 = time.perf_counter()
    score_run(cfg, run_id)
    t2 = time.perf_counter()
    rw = Lake(cfg.lake_root).read_parquet(Lake.run(run_id).rewards).select(["event_id", "reward"]).to_pandas()
    return t1 - t0, t2 - t1, rw.set_index("event_id")["reward"]


def pandas_path(cfg, start, end, out_dir: str) -> tuple[float, float, pd.Series]:
    """The same stage in plain pandas: read, filter, merge, groupby, apply."""
    lake, hc, rc = Lake(cfg.lake_root), cfg.harvest, cfg.rewards
    grace_end = end + pd.Timedelta(hours=hc.grace_hours)
    t0 = time.perf_counter()
    inter = pd.concat([pd.read_parquet(p) for p in lake.list_window("interactions", start, end)], ignore_index=True)
    fb = pd.concat([pd.read_parquet(p) for p in lake.list_window("feedback", start, grace_end)], ignore_index=True)
    inter = inter[(inter.ts_request >= start) & (inter.ts_request < end)]
    lag = POLICY - inter.model_version
    inter = inter[(lag >= 0) & (lag <= hc.max_staleness)].copy()
    inter["version_lag"] = POLICY - inter.model_version
    fb = fb[fb.ts < grace_end].drop_duplicates("feedback_id")
    fb = fb.merge(inter[["event_id", "org_id"]], on=["event_id", "org_id"])
    fb = fb.sort_values(["ts", "feedback_id"])
    for k in ("edit_applied", "edit_persisted", "edit_reverted"):
        fb[k] = fb.kind == k
    ok = fb.value_bool.fillna(False).astype(bool)
    bad = ~fb.value_bool.fillna(True).astype(bool)
    fb["tool_result_ok"], fb["tool_result_fail"] = (fb.kind == "tool_result") & ok, (fb.kind == "tool_result") & bad
    fb["thumbs_up"], fb["thumbs_down"] = (fb.kind == "thumbs") & ok, (fb.kind == "thumbs") & bad
    g = fb.groupby("event_id")
    agg = g[["edit_applied", "edit_persisted", "edit_reverted"]].any()
    agg = agg.join(g[["tool_result_ok", "tool_result_fail", "thumbs_up", "thumbs_down"]].sum())
    agg["n_feedback"] = g.size()
    agg["followup_text"] = fb[fb.kind == "followup_message"].groupby("event_id").text.agg("\n".join)
    ep = inter.merge(agg, left_on="event_id", right_index=True, how="left")
    for c in ("n_feedback", "tool_result_ok", "tool_result_fail", "thumbs_up", "thumbs_down"):
        ep[c] = ep[c].fillna(0).astype(int)
    for c in ("edit_applied", "edit_persisted", "edit_reverted"):
        ep[c] = ep[c].fillna(False).astype(bool)
    ep = ep.sort_values(["ts_request", "event_id"])
    ep.to_parquet(f"{out_dir}/episodes.parquet")
    t1 = time.perf_counter()

    strong, weak, pos = (re.compile(p) for p in (followup.STRONG, followup.WEAK, followup.POSITIVE))
    clar = re.compile(scorers.CLARIFY_CUES)

    def broken(row):
        try:
            tools = json.dumps(json.loads(row.messages).get("tools"))
        except (json.JSONDecodeError, AttributeError):
            tools = None
        return not scorers._all_valid(row.tool_calls, row.completion_text, scorers._validators(tools))

    text = ep.completion_text.fillna("")
    tc = ep.tool_calls.fillna("").str.strip()
    ep["has_calls"] = ((tc != "") & (tc != "[]")) | text.str.contains("<tool_call>", regex=False)
    ep["broken_tool_call"] = False
    ep.loc[ep.has_calls, "broken_tool_call"] = ep[ep.has_calls].apply(broken, axis=1)
    low = text.str.lower().str.strip()
    ep["is_clarifying"] = ((low.str.len() <= 400) & low.str.contains("?", regex=False) & low.str.contains(clar)
                           & ~low.str.contains("```", regex=False) & ~ep.has_calls)
    fu = ep.followup_text.fillna("").str.lower()
    ep["dissatisfied"] = fu.str.contains(strong) | (fu.str.contains(weak) & ~fu.str.contains(pos))
    w = ep.credit_weight if "credit_weight" in ep else 1.0
    s = pd.DataFrame(index=ep.index)
    s["edit_persisted"] = ep.edit_persisted * w
    s["edit_reverted"] = ep.edit_reverted * w
    s["dissatisfied_followup"] = ep.dissatisfied * w
    s["latency"] = (ep.latency_ms.clip(lower=0) / rc.latency_budget_ms).clip(upper=3).fillna(0)
    s["tool_call_validity"] = np.select(
        [ep.broken_tool_call, ep.has_calls & (ep.tool_result_fail > 0), ep.has_calls & (ep.tool_result_ok > 0)],
        [-1.0, -0.5, 1.0], 0.0)
    ep = ep.sort_values(["org_id", "session_id", "turn_index"])
    n_turns = ep.groupby(["org_id", "session_id"]).event_id.transform("size")
    asked = ep.groupby(["org_id", "session_id"]).is_clarifying.cumsum()
    allowed = np.maximum(1, np.floor(rc.clarification_rate_max * n_turns))
    s["clarification"] = ((ep.is_clarifying) & (asked > allowed)).astype(float)
    s["thumbs"] = np.sign(ep.thumbs_up - ep.thumbs_down) * w
    raw = sum(rc.weights[k] * s[k] for k in SIGNALS)
    reward = raw.clip(-rc.reward_clip, rc.reward_clip)
    ep = ep.loc[s.index]  # back to episode order (labels, not positions)
    reward = reward.where(~ep.broken_tool_call, np.minimum(reward, -abs(rc.weights["tool_call_validity"])))
    out = pd.DataFrame({"event_id": ep.event_id, **{k: s[k] for k in SIGNALS}, "reward": reward})
    out.to_parquet(f"{out_dir}/rewards.parquet")
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, out.set_index("event_id")["reward"]


def io_floor(cfg, start, end, run_id: str, out_dir: str) -> dict[str, float]:
    """The I/O every implementation of this stage pays, at its cheapest with Arrow (no compression, no dictionary,
    no fsync, one pass each): read the window's interaction columns the episodes carry, write the episodes,
    read back the columns the scorers judge. Best of 3 each (a floor, not a typical run)."""
    from rl_core.harvest import LAKE_COLUMNS, episodes_path

    lake = Lake(cfg.lake_root)
    files = lake.list_window("interactions", start, end)
    episodes = lake.read_parquet(episodes_path(lake, run_id))
    scorer_cols = ["completion_text", "tool_calls", "messages", "followup_text"]

    def best(f) -> float:
        times = []
        for _ in range(3):
            t = time.perf_counter()
            f()
            times.append(time.perf_counter() - t)
        return min(times)

    return {
        "read the lake's episode columns": best(lambda: [pq.read_table(p, columns=LAKE_COLUMNS) for p in files]),
        "write the episodes (uncompressed)": best(lambda: pq.write_table(
            episodes, f"{out_dir}/floor.parquet", compression="none", use_dictionary=False)),
        "read back the scorers' columns": best(lambda: pq.read_table(f"{out_dir}/floor.parquet",
                                                                     columns=scorer_cols)),
    }


def setup(home: str, n: int, seed: int):
    os.environ["RTRL_HOME"] = home
    cfg = load_config()
    start, end = window()
    t = time.perf_counter()
    generate(n, start, end, seed=seed, lake=Lake(cfg.lake_root))
    return cfg, start, end, time.perf_counter() - t


def row(name: str, n: int, th: float, tr: float) -> str:
    total = th + tr
    return f"| {name} | {n:,} | {th:.1f} | {tr:.1f} | {total:.1f} | {n / total:,.0f} | {60 * n / total:,.0f} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--pandas-n", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="runs per row; the row is the median one")
    args = ap.parse_args()
    os.environ.setdefault("RTRL_PROFILE", "tiny")
    lines = ["| implementation | interactions | harvest s | rewards s | total s | interactions/s | interactions/min |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    def median_run(f):  # the run with the median total of --repeat runs (this machine's timings vary by ~30%)
        runs = sorted((f() for _ in range(args.repeat)), key=lambda r: r[0] + r[1])
        return runs[len(runs) // 2]

    with tempfile.TemporaryDirectory() as big, tempfile.TemporaryDirectory() as small:
        cfg, start, end, gen_s = setup(big, args.n, args.seed)
        th, tr, _ = median_run(lambda: rtrl_path(cfg, start, end, "bench"))
        lines.append(row("rtrl: DuckDB + Arrow scorers", args.n, th, tr))
        cfg, start, end, _ = setup(small, args.pandas_n, args.seed + 1)
        sh, sr, ours = median_run(lambda: rtrl_path(cfg, start, end, "bench"))
        lines.append(row("rtrl: DuckDB + Arrow scorers", args.pandas_n, sh, sr))
        ph, pr, theirs = median_run(lambda: pandas_path(cfg, start, end, small))
        lines.append(row("plain pandas (baseline)", args.pandas_n, ph, pr))
        floor = io_floor(cfg, start, end, "bench", small)
    diff = float((ours - theirs.reindex(ours.index)).abs().max())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"generated {args.n:,} interactions (+ feedback) in {gen_s:.1f} s (not timed below); "
          f"each row: the median of {args.repeat} runs\n")
    print("\n".join(lines))
    print(f"\nspeed-up over pandas at {args.pandas_n:,} interactions: {(ph + pr) / (sh + sr):.1f}x; "
          f"max |reward difference| rtrl vs pandas: {diff:.2e}; peak RSS {rss:,.0f} MiB\n")
    budget = (ph + pr) / 10
    print(f"The I/O floor at {args.pandas_n:,} interactions (best of 3, no compression, no fsync), against the "
          f"{budget:.2f} s a 10x speed-up over pandas allows for the whole stage:\n")
    print("| I/O every implementation pays | s | share of the 10x budget |\n|---|---:|---:|")
    for name, s in floor.items():
        print(f"| {name} | {s:.2f} | {s / budget:.0%} |")
    total = sum(floor.values())
    print(f"| **floor total** | **{total:.2f}** | **{total / budget:.0%}** |")
    print(f"\nleft for the join, the aggregation, the tool-call schema checks and the signals: "
          f"{budget - total:.2f} s; rtrl takes {sh + sr:.2f} s in all, {sh + sr - total:.2f} s above the floor\n")
    rows = [json.loads(x) for x in (Path(__file__).resolve().parent.parent / "tests/data/followups.jsonl").open()]
    print(followup.evaluate(rows).table())


if __name__ == "__main__":
    main()
