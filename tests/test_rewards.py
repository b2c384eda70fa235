"""Rewards: SQL signals + Python scorers -> weighted reward; broken tool calls negative; hacking monitors."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from lab.testing.synth import ArmSpec, feedback_row, generate, interaction_row, window
from rl_core.cli import main
from rl_core.harvest import harvest
from rl_core.lake import Lake
from rl_core.rewards import SIGNALS, score_run
from rl_core.rewards.followup import evaluate
from rl_core.rewards.monitors import run_monitors, version_rates
from rl_core.rewards.scorers import is_clarifying, is_empty_or_refusal
from rl_core.schema import to_table

START, END = window()
DATA = Path(__file__).parent / "data" / "followups.jsonl"


def call(name: str, args) -> str:
    return json.dumps([{"id": "c0", "type": "function",
                        "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}])


def run(cfg, interactions, feedback=(), run_id="run-r", policy=1) -> dict[str, dict]:
    lake = Lake(cfg.lake_root)
    lake.write_partition("interactions", START, to_table("interactions", interactions))
    if feedback:
        lake.write_partition("feedback", START, to_table("feedback", list(feedback)))
    harvest(cfg, START, END, policy, run_id)
    score_run(cfg, run_id)
    return {r["event_id"]: r for r in lake.read_parquet(f"runs/{run_id}/rewards.parquet").to_pylist()}


def test_broken_tool_calls_are_negative_examples_never_dropped(cfg):
    t = START + timedelta(minutes=5)
    rows = {
        "bad_json": interaction_row(t, tool_calls=call("__invalid__", '{"path": '), finish_reason="tool_calls"),
        "missing_arg": interaction_row(t, tool_calls=call("read_file", {"file": "a.py"})),
        "wrong_type": interaction_row(t, tool_calls=call("apply_patch", {"path": 3, "diff": "x"})),
        "unknown_tool": interaction_row(t, tool_calls=call("rm_rf", {})),
        "in_text_only": interaction_row(t, completion_text='<tool_call>{"name": "read_file", "arguments": {}</tool_call>'),
        "valid": interaction_row(t, tool_calls=call("read_file", {"path": "a.py"})),
        "plain": interaction_row(t),
    }
    fb = [feedback_row(rows["valid"], "tool_result", value_bool=True),
          feedback_row(rows["missing_arg"], "edit_persisted", value_float=5.0),  # an outcome cannot rescue it
          feedback_row(rows["missing_arg"], "thumbs", value_bool=True)]
    out = run(cfg, list(rows.values()), fb)
    assert len(out) == len(rows)
    for name in ("bad_json", "missing_arg", "wrong_type", "unknown_tool", "in_text_only"):
        r = out[rows[name]["event_id"]]
        assert r["broken_tool_call"] and r["tool_call_validity"] == -1.0 and r["reward"] < 0, name
    assert out[rows["missing_arg"]["event_id"]]["reward"] == -cfg.rewards.weights["tool_call_validity"]
    valid = out[rows["valid"]["event_id"]]
    assert not valid["broken_tool_call"] and valid["tool_call_validity"] == 1.0 and valid["reward"] > 0
    assert out[rows["plain"]["event_id"]]["tool_call_validity"] == 0.0


def test_reward_is_the_weighted_sum_with_config_hash(cfg):
    t = START + timedelta(minutes=5)
    a = interaction_row(t, latency_ms=6000.0)
    b = interaction_row(t, session_id="s-2")
    fb = [feedback_row(a, "edit_applied"), feedback_row(a, "edit_persisted", value_float=2.0),
          feedback_row(a, "thumbs", value_bool=True),
          feedback_row(b, "followup_message", text="that's wrong, it still fails"),
          feedback_row(b, "edit_reverted")]
    out = run(cfg, [a, b], fb)
    w = cfg.rewards.weights
    ra, rb = out[a["event_id"]], out[b["event_id"]]
    assert (ra["edit_persisted"], ra["thumbs"], ra["latency"]) == (1.0, 1.0, 1.5)
    assert (rb["dissatisfied_followup"], rb["edit_reverted"], rb["latency"]) == (1.0, 1.0, 0.2)
    for r in (ra, rb):
        assert r["reward"] == pytest.approx(sum(w[s] * r[s] for s in SIGNALS))
        assert r["reward_config_hash"] == cfg.rewards.config_hash()
    cfg.rewards.weights = w | {"edit_persisted": 2.0}
    assert cfg.rewards.config_hash() != ra["reward_config_hash"]  # new weights, new hash


def test_clarification_beyond_rate_per_session_is_penalised(cfg):
    t = START + timedelta(minutes=5)
    ask = "Which file do you mean, a.py or b.py?"
    chatty = [interaction_row(t + timedelta(minutes=i), session_id="chatty", turn_index=i, completion_text=ask)
              for i in range(4)]
    once = [interaction_row(t + timedelta(minutes=i), session_id="once", turn_index=i,
                            completion_text=ask if i == 0 else "Fixed: see the diff.") for i in range(4)]
    out = run(cfg, chatty + once)
    assert [out[r["event_id"]]["is_clarifying"] for r in chatty] == [True] * 4
    assert [out[r["event_id"]]["clarification"] for r in chatty] == [0.0, 1.0, 1.0, 1.0]  # 1 free of 4 at 0.34
    assert [out[r["event_id"]]["clarification"] for r in once] == [0.0] * 4


def test_rerun_identical_and_bad_weights_refused(cfg):
    generate(800, START, END, seed=5, lake=Lake(cfg.lake_root))
    harvest(cfg, START, END, 2, "run-w")
    path = Lake(cfg.lake_root).path("runs/run-w/rewards.parquet")
    digests = [(score_run(cfg, "run-w"), hashlib.sha256(open(path, "rb").read()).digest())[1] for _ in range(2)]
    assert digests[0] == digests[1]
    cfg.rewards.weights = {k: v for k, v in cfg.rewards.weights.items() if k != "thumbs"}
    with pytest.raises(ValueError, match=r"rewards.weights: missing weight\(s\) for \['thumbs'\]"):
        score_run(cfg, "run-w")
    cfg.rewards.weights = cfg.rewards.weights | {"thumbs": 0.5, "tool_call_validity": 0.0}
    with pytest.raises(ValueError, match="rewards.weights.tool_call_validity must be > 0"):
        score_run(cfg, "run-w")
    assert hashlib.sha256(open(path, "rb").read()).digest() == digests[0]  # nothing stored changed
    cfg.rewards.weights = cfg.rewards.weights | {"tool_call_validity": 0.5}
    with pytest.raises(FileNotFoundError, match="rtrl harvest"):
        score_run(cfg, "run-missing")


def test_followup_classifier_precision_recall_on_labelled_set():
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    assert len(rows) >= 200 and 0.3 < sum(r["dissatisfied"] for r in rows) / len(rows) < 0.7
    report = evaluate(rows)
    assert report.precision >= 0.9 and report.recall >= 0.9, report.table()


def test_text_scorers():
    texts = pa.array(["Could you share the full traceback?", "Which file?", "```py\nx = 1\n```\nDo you want more?",
                      "", "I'm sorry, but I can't help with that.", "Done. Anything else?", None])
    no_calls = pa.array([False] * len(texts))
    assert is_clarifying(texts, no_calls).to_pylist() == [True, True, False, False, False, False, False]
    assert is_empty_or_refusal(texts, no_calls).to_pylist() == [False, False, False, True, True, False, True]


def test_monitor_trips_when_broken_tool_calls_rise_over_parent(cfg, capsys):
    arms = (ArmSpec(share=0.5), ArmSpec(name="challenger", model_version=2, share=0.5, tool_p=0.4, broken_tool_p=0.5))
    generate(3000, START, END, seed=6, lake=Lake(cfg.lake_root), arms=arms)
    harvest(cfg, START, END, 2, "run-m")
    score_run(cfg, "run-m")
    v = run_monitors(cfg, "run-m", parent_version=1)
    assert not v.passed and v.name == "monitors"
    assert any(r.startswith("version 2: broken_tool_rate") for r in v.reasons), v.reasons
    assert Lake(cfg.lake_root).read_json("runs/run-m/verdicts/monitors.json")["passed"] is False
    assert main(["rewards", "--run-id", "run-m", "--parent-version", "1"]) == 1
    assert "TRIPPED" in capsys.readouterr().out


def test_monitor_passes_on_equal_arms_and_uses_earlier_report(cfg):
    lake = Lake(cfg.lake_root)
    arms = (ArmSpec(share=0.5), ArmSpec(name="challenger", model_version=2, share=0.5))
    generate(3000, START, END, seed=8, lake=lake, arms=arms)
    harvest(cfg, START, END, 2, "run-p")
    score_run(cfg, "run-p")
    v = run_monitors(cfg, "run-p", parent_version=1)
    assert v.passed and v.details["compared"] == [2] and v.details["reference_source"] == "this window"
    # next window: only version 2 served, with broken calls; the parent's rates come from run-p's report
    s2, e2 = END, END + (END - START)
    generate(1500, s2, e2, seed=9, lake=lake,
             arms=(ArmSpec(name="champion", model_version=2, share=1.0, tool_p=0.4, broken_tool_p=0.5),))
    harvest(cfg, s2, e2, 2, "run-q")
    score_run(cfg, "run-q")
    v2 = run_monitors(cfg, "run-q", parent_version=1)
    assert not v2.passed and v2.details["reference_source"] == "run run-p"


def test_monitor_trips_when_a_version_stops_editing(cfg):
    """Prose-only answers (no tool call, no complete code block) rising versus the parent trip no_edit_rate;
    a code block cut off before its closing fence is not an edit either."""
    t = START + timedelta(minutes=5)
    fix = "Here is the fix:\n```python\ndef f(n):\n    return list(range(n))\n```"
    cut = "Here is the fix:\n```python\ndef f(n):\n    return list(ra"
    prose = "The loop stops one short; change the range bound and run the tests again."
    parent = [interaction_row(t, completion_text=fix) for _ in range(24)]
    child = [interaction_row(t, model_version=2, arm="challenger", completion_text=fix if i < 8 else (cut if i % 2 else prose))
             for i in range(24)]
    run(cfg, parent + child, run_id="run-e", policy=2)
    rates = version_rates(cfg, "run-e")
    assert rates[1]["no_edit_rate"] == 0 and rates[2]["no_edit_rate"] == pytest.approx(16 / 24)
    v = run_monitors(cfg, "run-e", parent_version=1)
    assert not v.passed and any(r.startswith("version 2: no_edit_rate") for r in v.reasons), v.reasons


def test_monitors_judge_every_served_turn_and_only_the_rollback_moves_the_challenger(registered):
    from rl_core.registry import card, promote, store
    from rl_core.rewards.monitors import monitor_served, score_served

    cfg = registered
    v2 = store.register_checkpoint(cfg, store.checkpoint_path(cfg, 1), run_name="hacky",
                                   tags={"parent_version": 1})
    store.set_alias(cfg, "challenger", v2, "test: deployed")
    arms = (ArmSpec(share=0.5), ArmSpec(name="challenger", model_version=v2, share=0.5, tool_p=0.4, broken_tool_p=0.5))
    generate(2000, START, END, seed=6, lake=Lake(cfg.lake_root), arms=arms)
    harvest(cfg, START, END, 1, "run-x")  # as the cycle does: the champion's lag range, without v2's turns
    score_run(cfg, "run-x")
    assert run_monitors(cfg, "run-x", parent_version=1).details["compared"] == []  # v2 is not in that harvest

    score_served(cfg, "run-x", START, END, newest=v2)
    v = monitor_served(cfg, "run-x", 1)
    assert not v.passed and v.details["tripped"] == [v2]
    assert store.aliases(cfg) == {"champion": 1, "challenger": v2}  # the check only judges
    assert "would be rolled back" in promote.take_off_tripped(cfg, v, dry_run=True)
    assert store.aliases(cfg) == {"champion": 1, "challenger": v2}  # a dry run moves nothing
    assert "rolled back" in promote.take_off_tripped(cfg, v)
    assert store.aliases(cfg) == {"champion": 1}  # off traffic; the champion untouched
    assert v2 in promote.rolled_back_versions(cfg)
    saved = Lake(cfg.lake_root).read_json("runs/run-x/verdicts/monitors.json")
    assert saved["passed"] is False and saved["details"]["tripped"] == [v2]

    # what an operator sees in MLflow: the rates and rises on v2's run, the report, the verdict on its page
    card.log_monitors(cfg, v)
    c = store.client(cfg)
    mv = store.get_version(cfg, v2)
    m = c.get_run(mv.run_id).data.metrics
    assert m["monitor/broken_tool_rate_rise"] > cfg.rewards.monitor_broken_tool_rise and m["monitor/n"] > 0
    assert {a.path for a in c.list_artifacts(mv.run_id, "monitors")} == {"monitors/run-x.json"}
    assert mv.tags["monitor.verdict"] == "tripped" and "| monitors | tripped (broken_tool_rate +" in mv.description


def test_an_honest_challenger_passes_and_a_silent_window_passes_saying_so(registered):
    from rl_core.registry import promote, store
    from rl_core.rewards.monitors import monitor_served, score_served

    cfg = registered
    v2 = store.register_checkpoint(cfg, store.checkpoint_path(cfg, 1), run_name="honest", tags={"parent_version": 1})
    store.set_alias(cfg, "challenger", v2, "test: deployed")
    generate(2000, START, END, seed=8, lake=Lake(cfg.lake_root),
             arms=(ArmSpec(share=0.5), ArmSpec(name="challenger", model_version=v2, share=0.5)))
    score_served(cfg, "run-y", START, END, newest=v2)
    v = monitor_served(cfg, "run-y", 1)
    assert v.passed and v.details["compared"] == [v2]
    assert promote.take_off_tripped(cfg, v) == "nothing to take off traffic"
    assert store.aliases(cfg) == {"champion": 1, "challenger": v2}
    later = (END, END + (END - START))
    score_served(cfg, "run-z", *later, newest=v2)  # no traffic there
    quiet = monitor_served(cfg, "run-z", 1)
    assert quiet.passed and quiet.details["note"] == "the window served no turns"


def test_monitor_trips_when_the_mean_reward_falls_significantly_below_the_parent(cfg):
    """A worse version is no hack, but with every user on the challenger nothing else would stop it (run L)."""
    t = START + timedelta(minutes=5)
    parent = [interaction_row(t, session_id=f"p{i}") for i in range(40)]
    child = [interaction_row(t, model_version=2, arm="challenger", session_id=f"c{i}") for i in range(40)]
    # the parent's edits persist 3 times in 4, the child's once in 4: rewards differ by ~0.5, many SEs
    fb = [feedback_row(r, "edit_persisted", value_float=2.0) for r in parent if int(r["session_id"][1:]) % 4]
    fb += [feedback_row(r, "edit_persisted", value_float=2.0) for r in child if int(r["session_id"][1:]) % 4 == 0]
    run(cfg, parent + child, fb, run_id="run-d", policy=2)
    rates = version_rates(cfg, "run-d")
    assert rates[2]["mean_reward"] < rates[1]["mean_reward"] - 0.4 and rates[1]["reward_std"] > 0
    v = run_monitors(cfg, "run-d", parent_version=1)
    assert not v.passed and v.details["tripped"] == [2]
    assert any(r.startswith("version 2: mean_reward") and "z " in r for r in v.reasons), v.reasons
    # the same drop judged inside the noise (a z it does not reach) or below the bound: passes
    cfg.rewards.monitor_reward_z = 50.0
    assert run_monitors(cfg, "run-d", parent_version=1).passed
    cfg.rewards.monitor_reward_z, cfg.rewards.monitor_reward_drop = 2.58, 1.0
    assert run_monitors(cfg, "run-d", parent_version=1).passed


def test_reward_drop_needs_both_spreads():
    from rl_core.rewards.monitors import reward_drop

    new, old = {"n": 100, "mean_reward": -0.4, "reward_std": 0.5}, {"n": 100, "mean_reward": -0.2, "reward_std": 0.5}
    assert reward_drop(new, old, 0.1, 2.58)  # 0.2 drop, z -2.83
    assert reward_drop(new, old, 0.1, 3.0) is None
    assert reward_drop(new, {"n": 100, "mean_reward": -0.2}, 0.1, 2.58) is None  # a report from before reward_std
    assert reward_drop(old, new, 0.1, 2.58) is None  # a rise never trips
