"""The raw-event generator: deterministic, partitioned like the collector, per-arm rates, planted defects."""

from __future__ import annotations

import duckdb
import pytest

from lab.testing.synth import ArmSpec, Defects, generate, window
from rl_core.lake import Lake

START, END = window(hours=3)


def test_same_seed_same_files_and_partitions(tmp_path):
    a = generate(3000, START, END, seed=7, lake=Lake(str(tmp_path / "a")))
    b = generate(3000, START, END, seed=7, lake=Lake(str(tmp_path / "b")))
    assert a.n_interactions == 3000 and a.n_feedback > 3000
    assert [p.split("/a/", 1)[1] for p in a.interaction_files] == [p.split("/b/", 1)[1] for p in b.interaction_files]
    assert all(open(x, "rb").read() == open(y, "rb").read() for x, y in zip(a.interaction_files, b.interaction_files,
                                                                           strict=True))
    assert len(a.interaction_files) == 3  # one per hour partition of the 3 h window
    rows = duckdb.sql(f"SELECT count(*), count(DISTINCT event_id), min(ts_request), max(ts_request), "
                      f"max(list_max(completion_logprobs)), bool_and(len(completion_logprobs) = "
                      f"len(completion_token_ids)) FROM read_parquet({a.interaction_files})").fetchall()[0]
    assert rows[0] == rows[1] == 3000 and rows[2] >= START and rows[3] < END and rows[4] <= 0 and rows[5]


def test_arm_rates_follow_their_specs(tmp_path):
    arms = (ArmSpec(share=0.5, dissatisfied_p=0.05, latency_ms=500),
            ArmSpec(name="challenger", model_version=2, share=0.5, dissatisfied_p=0.5, latency_ms=2000))
    r = generate(6000, START, END, seed=1, lake=Lake(str(tmp_path)), arms=arms)
    q = f"""SELECT i.arm, any_value(i.model_version), median(i.latency_ms),
              avg((f.text IN ('that''s wrong, it still fails', 'no, this doesn''t work', 'you broke the build',
                   'still getting the same error', 'that is not what I asked', 'ugh, revert that', 'this is useless',
                   'why did you delete my function?', 'wrong file', 'it doesn''t compile now', 'nope, same KeyError',
                   'stop changing unrelated code'))::INT)
            FROM read_parquet({r.interaction_files}) i JOIN read_parquet({r.feedback_files}) f USING (event_id)
            WHERE f.kind = 'followup_message' GROUP BY i.arm ORDER BY i.arm"""
    (ch_arm, ch_v, ch_lat, ch_dis), (c_arm, c_v, c_lat, c_dis) = duckdb.sql(q).fetchall()
    assert (ch_arm, ch_v, c_arm, c_v) == ("challenger", 2, "champion", 1)
    assert ch_lat > 3 * c_lat and ch_dis > 0.4 > 0.2 > c_dis


def test_planted_defects_are_where_reported(tmp_path):
    d = Defects(duplicate_events=3, positive_logprobs=2, nan_logprobs=1, wrong_version=2, nan_latency=1)
    r = generate(500, START, END, seed=2, lake=Lake(str(tmp_path)), defects=d)
    files = r.interaction_files
    con = duckdb.connect()
    con.execute("SET disabled_optimizers = 'statistics_propagation'")
    dup = con.sql(f"SELECT event_id FROM read_parquet({files}) GROUP BY 1 HAVING count(*) > 1 ORDER BY 1").fetchall()
    assert sorted(x for (x,) in dup) == sorted(r.planted["duplicate_events"]) and r.n_interactions == 503
    pos = con.sql(f"SELECT event_id FROM read_parquet({files}) WHERE list_max(completion_logprobs) > 0").fetchall()
    # NaN sorts above every number in DuckDB, so the NaN-logprob row shows up here too
    assert {x for (x,) in pos} == set(r.planted["positive_logprobs"]) | set(r.planted["nan_logprobs"])
    wrong = con.sql(f"SELECT DISTINCT event_id FROM read_parquet({files}) WHERE model_version = 99").fetchall()
    assert sorted(x for (x,) in wrong) == sorted(r.planted["wrong_version"])
    nan = con.sql(f"SELECT event_id, isnan(latency_ms) AS bad FROM read_parquet({files})").fetchall()
    assert sorted(e for e, bad in nan if bad) == sorted(r.planted["nan_latency"])


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="n_interactions"):
        generate(0, START, END, lake=Lake(str(tmp_path)))
    with pytest.raises(ValueError, match="start and end"):
        generate(10, END, START, lake=Lake(str(tmp_path)))
