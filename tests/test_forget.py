"""`rtrl forget`: an organisation's or a user's rows leave every raw partition and run output; others stay."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa

from rl_core.forget import forget, is_forgotten, load_registry
from rl_core.lake import Lake
from rl_core.schema import FeedbackEvent, InteractionEvent, to_table

T0 = datetime(2026, 12, 2, 10, 0, tzinfo=timezone.utc)


def seed(lake: Lake):
    rows, fb = [], []
    for i, (org, user) in enumerate([("org-a", "u1"), ("org-a", "u2"), ("org-b", "u1"), ("org-a", "u1")]):
        ev = InteractionEvent(org_id=org, user_id=user, session_id=f"s{i}", ts_request=T0 + timedelta(hours=i % 2),
                              ts_response=T0 + timedelta(hours=i % 2, seconds=1), requested_model="auto",
                              model_version=1, arm="champion", messages=[{"role": "user", "content": f"m{i}"}],
                              prompt_token_ids=[1], completion_token_ids=[2], completion_logprobs=[-0.5])
        rows.append(ev.to_row())
        fb.append(FeedbackEvent(event_id=ev.event_id, org_id=org, kind="thumbs", value_bool=True, ts=ev.ts_response).to_row())
    for h in (0, 1):
        lake.write_partition("interactions", T0 + timedelta(hours=h), to_table("interactions", [r for r in rows if r["ts_request"].hour == 10 + h]))
    lake.write_partition("feedback", T0, to_table("feedback", fb))
    lake.write_parquet("runs/r1/episodes.parquet", pa.table({"event_id": [r["event_id"] for r in rows],
                                                             "org_id": [r["org_id"] for r in rows],
                                                             "user_id": [r["user_id"] for r in rows]}))
    return rows


def all_rows(lake: Lake, table: str):
    t = lake.read_window(table, T0, T0 + timedelta(hours=2))
    return [] if t is None else t.to_pylist()


def test_forget_user_removes_only_their_rows(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    rows = seed(lake)
    rep = forget(lake, "org-a", "u1", reason="user request")
    assert rep.interactions_removed == 2 and rep.feedback_removed == 2 and rep.run_rows_removed == 2
    left = all_rows(lake, "interactions")
    assert sorted((r["org_id"], r["user_id"]) for r in left) == [("org-a", "u2"), ("org-b", "u1")]
    kept_ids = {r["event_id"] for r in left}
    assert {r["event_id"] for r in all_rows(lake, "feedback")} == kept_ids
    assert set(lake.read_parquet("runs/r1/episodes.parquet")["event_id"].to_pylist()) == kept_ids
    assert len(rows) == 4
    reg = load_registry(lake)
    assert is_forgotten(reg, "org-a", "u1") and not is_forgotten(reg, "org-a", "u2")
    assert lake.list_files("forget") == [] and lake.fs.find(lake.path("forget/requests"))


def test_forget_org_removes_everything_of_it_and_deletes_empty_files(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    seed(lake)
    rep = forget(lake, "org-a")
    assert rep.interactions_removed == 3 and rep.feedback_removed == 3
    assert [r["org_id"] for r in all_rows(lake, "interactions")] == ["org-b"]
    assert is_forgotten(load_registry(lake), "org-a", "anyone")
    again = forget(lake, "org-a")
    assert again.interactions_removed == 0 and again.files_rewritten == 0


def test_forget_needs_an_org(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="--org"):
        forget(Lake(str(tmp_path / "l")), "")
