"""Event contract: each validation rule refuses what it should, and rows fit the pyarrow schemas."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from pydantic import ValidationError

from rl_core.schema import (
    FEEDBACK_SCHEMA,
    INTERACTIONS_SCHEMA,
    FeedbackEvent,
    InteractionEvent,
    conform,
    to_table,
)

T0 = datetime(2026, 12, 2, 10, 0, tzinfo=timezone.utc)


def interaction(**over):
    base = dict(
        user_id="u1", session_id="s1", turn_index=0, ts_request=T0, ts_response=T0 + timedelta(seconds=1),
        requested_model="auto", model_version=1, arm="champion",
        messages=[{"role": "user", "content": "fix the bug"}],
        prompt_token_ids=[1, 2, 3], completion_token_ids=[4, 5], completion_logprobs=[-0.1, -2.0],
        completion_text="ok", org_id="org-a",
    )
    base.update(over)
    return InteractionEvent(**base)


def test_valid_interaction_round_trips_through_arrow():
    ev = interaction(tool_calls=[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}])
    t = to_table("interactions", [ev.to_row()])
    assert t.schema == INTERACTIONS_SCHEMA
    row = t.to_pylist()[0]
    assert row["completion_logprobs"] == pytest.approx([-0.1, -2.0])
    assert row["messages"].startswith("[") and '"fix the bug"' in row["messages"]
    uuid.UUID(row["event_id"])


@pytest.mark.parametrize(
    "over, needle",
    [
        ({"completion_logprobs": [-0.1]}, "one logprob per completion token"),
        ({"completion_logprobs": [-0.1, 0.5]}, "must be <= 0"),
        ({"completion_logprobs": [-0.1, float("nan")]}, "must be <= 0"),
        ({"event_id": "not-a-uuid"}, "event_id must be a UUID"),
        ({"arm": "canary"}, "arm"),
        ({"model_version": 0}, "model_version"),
        ({"ts_response": T0 - timedelta(seconds=1)}, "ts_response is before ts_request"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_interaction_rules(over, needle):
    with pytest.raises(ValidationError) as e:
        interaction(**over)
    assert needle in str(e.value)


def feedback(**over):
    base = dict(event_id=str(uuid.uuid4()), kind="thumbs", value_bool=True, org_id="org-a", ts=T0)
    base.update(over)
    return FeedbackEvent(**base)


def test_valid_feedback_fits_schema():
    t = to_table("feedback", [feedback().to_row(), feedback(kind="edit_persisted", value_bool=None, value_float=6.0).to_row()])
    assert t.schema == FEEDBACK_SCHEMA and t.num_rows == 2


@pytest.mark.parametrize(
    "over, needle",
    [
        ({"kind": "like"}, "kind"),
        ({"event_id": "123"}, "event_id must be a UUID"),
        ({"feedback_id": "x"}, "feedback_id must be a UUID"),
        ({"kind": "followup_message", "value_bool": None}, "needs text"),
        ({"kind": "tool_result", "value_bool": None}, "needs value_bool"),
        ({"kind": "edit_persisted", "value_bool": None}, "hours observed"),
        ({"kind": "edit_persisted", "value_float": float("inf")}, "finite"),
    ],
)
def test_feedback_rules(over, needle):
    with pytest.raises(ValidationError) as e:
        feedback(**over)
    assert needle in str(e.value)


def test_naive_timestamps_become_utc():
    ev = feedback(ts=datetime(2026, 1, 1, 12, 0))
    assert ev.ts.tzinfo == timezone.utc


def test_conform_orders_casts_and_reports_missing_columns():
    ev = interaction()
    t = to_table("interactions", [ev.to_row()])
    shuffled = t.select(list(reversed(t.column_names)))
    assert conform("interactions", shuffled).schema == INTERACTIONS_SCHEMA
    with pytest.raises(ValueError, match="lacks columns"):
        conform("interactions", pa.table({"event_id": ["x"]}))
