"""The lake's schemas, frozen: the Arrow schemas are derived from the event models (rl_core/schema.py,
arrow_schema), so an edit of a model would otherwise change every Parquet file written after it silently.

The texts below were printed from the hand-written schemas this derivation replaced (issue 42), and the
derived ones were byte-for-byte equal to them (Schema.serialize()). A change here is a change of the lake's
contract: make it on purpose, with docs/design.md and a migration of what the lake holds.
"""

from __future__ import annotations

from typing import Annotated, Any

import pyarrow as pa
import pytest
from pydantic import BaseModel

from rl_core import schema

INTERACTIONS_SCHEMA = """\
event_id: string not null
org_id: string not null
user_id: string not null
session_id: string not null
turn_index: int32 not null
ts_request: timestamp[us, tz=UTC] not null
ts_response: timestamp[us, tz=UTC] not null
requested_model: string not null
model_version: int64 not null
adapter_version: string
arm: string not null
messages: string not null
prompt_token_ids: list<item: int32> not null
  child 0, item: int32
completion_token_ids: list<item: int32> not null
  child 0, item: int32
completion_logprobs: list<item: float> not null
  child 0, item: float
completion_text: string not null
tool_calls: string
finish_reason: string
latency_ms: double
ttft_ms: double
temperature: float
top_p: float
"""

FEEDBACK_SCHEMA = """\
feedback_id: string not null
event_id: string not null
org_id: string not null
ts: timestamp[us, tz=UTC] not null
kind: string not null
value_bool: bool
value_float: double
text: string
"""

EPISODES_SCHEMA = """\
event_id: string
org_id: string
user_id: string
session_id: string
turn_index: int32
ts_request: timestamp[us, tz=UTC]
model_version: int64
adapter_version: string
arm: string
version_lag: int32
messages: string
prompt_token_ids: list<item: int32>
  child 0, item: int32
completion_token_ids: list<item: int32>
  child 0, item: int32
completion_logprobs: list<item: float>
  child 0, item: float
completion_text: string
tool_calls: string
finish_reason: string
latency_ms: double
temperature: float
top_p: float
n_feedback: int32
edit_applied: bool
edit_persisted: bool
edit_persisted_hours: double
edit_reverted: bool
followup_text: string
tool_result_ok: int32
tool_result_fail: int32
thumbs_up: int32
thumbs_down: int32
session_end: bool
credit_weight: double
"""


def _text(s: pa.Schema) -> str:
    return s.to_string(show_field_metadata=True, show_schema_metadata=True) + "\n"


@pytest.mark.parametrize("name", ["INTERACTIONS_SCHEMA", "FEEDBACK_SCHEMA", "EPISODES_SCHEMA"])
def test_schemas_are_what_the_lake_holds(name):
    """Field order, types (timestamp[us, tz=UTC], list<float32>, int32 or int64), nullability of each column
    and of list items, and no metadata."""
    got = getattr(schema, name)
    assert _text(got) == globals()[name]
    assert got.metadata is None and all(f.metadata is None for f in got)


def test_contract_tables_are_the_derived_schemas():
    assert schema.SCHEMAS == {"interactions": schema.INTERACTIONS_SCHEMA, "feedback": schema.FEEDBACK_SCHEMA}
    assert schema.arrow_schema(schema.InteractionEvent).equals(schema.INTERACTIONS_SCHEMA, check_metadata=True)


def test_a_field_without_a_column_type_must_say_one():
    """A union of several types (a JSON column) has no obvious Arrow type: arrow_schema refuses to guess."""

    class Loose(BaseModel):
        payload: list[dict[str, Any]] | str

    with pytest.raises(TypeError, match="payload: no lake column type"):
        schema.arrow_schema(Loose)

    class Marked(BaseModel):
        payload: Annotated[list[dict[str, Any]] | str, schema.JsonText] | None = None
        n: schema.TurnIndex = 0

    assert _text(schema.arrow_schema(Marked)) == "payload: string\nn: int32 not null\n"
