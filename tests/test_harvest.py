"""Harvest: DuckDB over the lake's window -> episodes.parquet (window, staleness, feedback join, reruns)."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone

import pyarrow.parquet as pq
import pytest

from lab.testing.synth import ArmSpec, feedback_row, generate, interaction_row, window
from rl_core.cli import main
from rl_core.harvest import harvest
from rl_core.lake import Lake
from rl_core.schema import EPISODES_SCHEMA, to_table

START, END = window()


def write(lake: Lake, interactions: list[dict], feedback: list[dict]) -> None:
    for r in interactions:
        lake.write_partition("interactions", r["ts_request"], to_table("interactions", [r]))
    for f in feedback:
        lake.write_partition("feedback", f["ts"], to_table("feedback", [f]))


def episodes(cfg, run_id: str) -> list[dict]:
    return Lake(cfg.lake_root).read_parquet(f"runs/{run_id}/episodes.parquet").to_pylist()


def test_window_staleness_and_feedback_join(cfg):
    lake = Lake(cfg.lake_root)
    t = START + timedelta(hours=1)
    keep = interaction_row(t, model_version=3)
    stale = interaction_row(t, model_version=1)  # policy 4, max_staleness 2 -> lag 3 is out
    newer = interaction_row(t, model_version=5, arm="challenger")  # newer than the policy: not its data
    before = interaction_row(START - timedelta(seconds=1), model_version=4)
    at_end = interaction_row(END, model_version=4)  # [start, end): excluded
    fb = [
        feedback_row(keep, "edit_applied"),
        feedback_row(keep, "edit_persisted", delay=timedelta(hours=3), value_float=3.0),
        feedback_row(keep, "followup_message", text="still broken"),
        feedback_row(keep, "tool_result", value_bool=True),
        feedback_row(keep, "thumbs", value_bool=False),
        feedback_row(keep, "thumbs", value_bool=False, org_id="org-evil"),  # another org: ignored
        feedback_row(keep, "edit_reverted", delay=timedelta(hours=20)),  # after end + grace (6 h): ignored
    ]
    fb.append(dict(fb[0]))  # the same feedback_id twice (a retried POST): counted once
    write(lake, [keep, stale, newer, before, at_end], fb)

    r = harvest(cfg, START, END, 4, "run-a")
    assert (r.n_interactions, r.n_episodes, r.n_stale, r.n_with_feedback) == (3, 1, 2, 1)
    (ep,) = episodes(cfg, "run-a")
    assert ep["event_id"] == keep["event_id"] and ep["version_lag"] == 1
    assert ep["n_feedback"] == 5 and ep["edit_applied"] and ep["edit_persisted"] and not ep["edit_reverted"]
    assert ep["edit_persisted_hours"] == 3.0 and ep["followup_text"] == "still broken"
    assert (ep["tool_result_ok"], ep["tool_result_fail"], ep["thumbs_up"], ep["thumbs_down"]) == (1, 0, 0, 1)
    assert ep["completion_logprobs"] == pytest.approx(keep["completion_logprobs"]) and ep["credit_weight"] == 1.0
    assert pq.read_schema(r.path).names == EPISODES_SCHEMA.names
    assert Lake(cfg.lake_root).read_json("runs/run-a/harvest.json")["policy_version"] == 4


def test_rerun_gives_identical_files(cfg):
    generate(600, START, END, seed=3, lake=Lake(cfg.lake_root))
    digests = []
    for _ in range(2):
        harvest(cfg, START, END, 2, "run-b")
        digests.append(hashlib.sha256(open(Lake(cfg.lake_root).path("runs/run-b/episodes.parquet"), "rb").read()).digest())
    assert digests[0] == digests[1]
    eps = episodes(cfg, "run-b")
    assert len(eps) == 600 and len({e["event_id"] for e in eps}) == 600


def test_session_granularity_credits_outcome_back_with_discount(cfg):
    cfg.harvest.granularity = "session"
    cfg.harvest.session_discount = 0.5
    lake = Lake(cfg.lake_root)
    t = START + timedelta(minutes=10)
    turns = [interaction_row(t + timedelta(minutes=i), session_id="s-9", turn_index=i) for i in range(3)]
    fb = [feedback_row(turns[2], "edit_persisted", delay=timedelta(hours=2), value_float=2.0),
          feedback_row(turns[2], "session_end")]
    write(lake, turns, fb)
    harvest(cfg, START, END, 1, "run-s")
    eps = sorted(episodes(cfg, "run-s"), key=lambda e: e["turn_index"])
    assert [e["credit_weight"] for e in eps] == [0.25, 0.5, 1.0]
    assert all(e["edit_persisted"] and e["session_end"] and e["n_feedback"] == 2 for e in eps)


@pytest.mark.parametrize("kwargs, message", [
    ({"start": datetime(2026, 12, 2, 5), "end": END}, "start must be timezone-aware"),
    ({"start": END, "end": START}, "must be after start"),
    ({"start": START, "end": END, "policy_version": 0}, "policy_version"),
    ({"start": START, "end": END, "run_id": "../x"}, "run_id"),
])
def test_bad_input_names_the_field_and_writes_nothing(cfg, kwargs, message):
    args = {"policy_version": 1, "run_id": "run-x"} | kwargs
    with pytest.raises(ValueError, match=message):
        harvest(cfg, args["start"], args["end"], args["policy_version"], args["run_id"])
    assert not Lake(cfg.lake_root).exists("runs")


def test_cli_harvest(cfg, capsys):
    generate(200, START, END, seed=4, lake=Lake(cfg.lake_root))
    rc = main(["harvest", "--start", START.isoformat(), "--end", END.astimezone(timezone.utc).isoformat(),
               "--policy-version", "2", "--run-id", "run-cli"])
    assert rc == 0 and "200 episodes" in capsys.readouterr().out
    assert main(["harvest", "--start", END.isoformat(), "--end", START.isoformat(), "--policy-version", "2",
                 "--run-id", "run-cli2"]) == 2


def test_fsspec_lake_is_read_by_duckdb_directly(rtrl_home, monkeypatch):
    from rl_core.config import load_config
    from rl_core.rewards import score_run

    monkeypatch.setenv("RTRL_LAKE__ROOT", f"memory://lake-{rtrl_home.name}-{id(monkeypatch)}")
    cfg = load_config()
    generate(300, START, END, seed=5, lake=Lake(cfg.lake_root))
    r = harvest(cfg, START, END, 2, "run-mem")
    assert r.n_episodes == 300 and r.n_interaction_files == 5
    assert score_run(cfg, "run-mem").n_episodes == 300


@pytest.mark.parametrize("org_id", [None, "org-globex"])
def test_streamed_in_small_batches_gives_the_same_episodes(cfg, monkeypatch, org_id):
    """The join's result is streamed from DuckDB and each file decoded forward a batch at a time
    (rl_core/harvest.py's _FileCursor): with batches of a few rows, every way a selection can fall across
    batch and file boundaries (gaps from another version's or org's rows, runs that end mid-batch) must
    give the same episodes, row for row, as the default batch sizes."""
    import rl_core.harvest as harvest_module

    champion, challenger = ArmSpec("champion", 1, 0.6), ArmSpec("challenger", 2, 0.4)  # v2 rows: gaps for v1
    generate(400, START, END, seed=5, lake=Lake(cfg.lake_root), arms=(champion, challenger))
    whole = harvest(cfg, START, END, 1, "big-batches", org_id=org_id)
    monkeypatch.setattr(harvest_module, "READ_ROWS", 7)
    monkeypatch.setattr(harvest_module, "BATCH_ROWS", 31)
    small = harvest(cfg, START, END, 1, "small-batches", org_id=org_id)
    a, b = (pq.read_table(r.path) for r in (whole, small))
    assert 0 < small.n_episodes == whole.n_episodes < small.n_interactions  # a sparse selection
    assert a.equals(b) and pq.ParquetFile(small.path).metadata.num_row_groups > 1
