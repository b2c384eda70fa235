"""The event contract (design.md, "Events"): pyarrow schemas for the lake, pydantic models for the API.

`interactions`: one row per model completion, with what on-policy RL needs (token ids, the sampled
tokens' logprobs under the sampling distribution actually used, the exact model version).
`feedback`: zero or more later reactions to an interaction.

`adapter_version` (nullable) extends design.md's list: the per-organisation LoRA adapter that served the
turn, if any (docs/architecture.md records the change).
"""

from __future__ import annotations

import json
import math
import uuid
from datetime import datetime, timezone
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

TS = pa.timestamp("us", tz="UTC")

ARMS = ("champion", "challenger", "pinned")
FEEDBACK_KINDS = (
    "followup_message",
    "edit_applied",
    "edit_persisted",
    "edit_reverted",
    "tool_result",
    "thumbs",
    "session_end",
)

INTERACTIONS_SCHEMA = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("org_id", pa.string(), nullable=False),
        pa.field("user_id", pa.string(), nullable=False),
        pa.field("session_id", pa.string(), nullable=False),
        pa.field("turn_index", pa.int32(), nullable=False),
        pa.field("ts_request", TS, nullable=False),
        pa.field("ts_response", TS, nullable=False),
        pa.field("requested_model", pa.string(), nullable=False),
        pa.field("model_version", pa.int64(), nullable=False),
        pa.field("adapter_version", pa.string()),
        pa.field("arm", pa.string(), nullable=False),
        pa.field("messages", pa.string(), nullable=False),  # JSON: prompt messages and tools
        pa.field("prompt_token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("completion_token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("completion_logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("completion_text", pa.string(), nullable=False),
        pa.field("tool_calls", pa.string()),  # JSON list of OpenAI tool calls, or null
        pa.field("finish_reason", pa.string()),
        pa.field("latency_ms", pa.float64()),
        pa.field("ttft_ms", pa.float64()),
        pa.field("temperature", pa.float32()),
        pa.field("top_p", pa.float32()),
    ]
)

FEEDBACK_SCHEMA = pa.schema(
    [
        pa.field("feedback_id", pa.string(), nullable=False),
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("org_id", pa.string(), nullable=False),
        pa.field("ts", TS, nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("value_bool", pa.bool_()),
        pa.field("value_float", pa.float64()),
        pa.field("text", pa.string()),
    ]
)

# The contract of episodes.parquet (the trainer, rewards and gates read it).
EPISODES_SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("org_id", pa.string()),
        ("user_id", pa.string()),
        ("session_id", pa.string()),
        ("turn_index", pa.int32()),
        ("ts_request", TS),
        ("model_version", pa.int64()),
        ("adapter_version", pa.string()),  # the org's LoRA adapter that answered on model_version, if any
        ("arm", pa.string()),
        ("version_lag", pa.int32()),
        ("messages", pa.string()),
        ("prompt_token_ids", pa.list_(pa.int32())),
        ("completion_token_ids", pa.list_(pa.int32())),
        ("completion_logprobs", pa.list_(pa.float32())),
        ("completion_text", pa.string()),
        ("tool_calls", pa.string()),
        ("finish_reason", pa.string()),
        ("latency_ms", pa.float64()),
        ("temperature", pa.float32()),  # the sampling parameters the behaviour logprobs are under
        ("top_p", pa.float32()),
        ("n_feedback", pa.int32()),
        ("edit_applied", pa.bool_()),
        ("edit_persisted", pa.bool_()),
        ("edit_persisted_hours", pa.float64()),
        ("edit_reverted", pa.bool_()),
        ("followup_text", pa.string()),
        ("tool_result_ok", pa.int32()),
        ("tool_result_fail", pa.int32()),
        ("thumbs_up", pa.int32()),
        ("thumbs_down", pa.int32()),
        ("session_end", pa.bool_()),
        ("credit_weight", pa.float64()),
    ]
)

# The contract of rewards.parquet: one row per episode, in episodes.parquet's order (rl_core/rewards).
SIGNALS = ("edit_persisted", "edit_reverted", "dissatisfied_followup", "latency", "tool_call_validity",
           "clarification", "thumbs")

REWARDS_SCHEMA = pa.schema(
    [("event_id", pa.string())] + [(s, pa.float64()) for s in SIGNALS]
    + [("broken_tool_call", pa.bool_()), ("is_clarifying", pa.bool_()), ("reward", pa.float64()),
       ("reward_config_hash", pa.string())]
)

# The ledger of consumed episodes (rl_core/ledger.py): which run trained on which episode, per lineage.
LEDGER_SCHEMA = pa.schema([
    ("event_id", pa.string()),
    ("run_id", pa.string()),
    ("version", pa.int64()),  # the version the run registered
    ("parent_version", pa.int64()),  # the version it was trained from
])


SCHEMAS = {"interactions": INTERACTIONS_SCHEMA, "feedback": FEEDBACK_SCHEMA}
TS_COLUMN = {"interactions": "ts_request", "feedback": "ts"}  # the column that picks the partition


def _uuid(v: str, field: str) -> str:
    try:
        uuid.UUID(str(v))
    except (ValueError, AttributeError, TypeError):
        raise ValueError(f"{field} must be a UUID, got {v!r}") from None
    return str(v)


def _utc(v: datetime) -> datetime:
    return v.replace(tzinfo=timezone.utc) if v.tzinfo is None else v.astimezone(timezone.utc)


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InteractionEvent(Strict):
    """One assistant turn. org_id is set by the server from the bearer token, never from a request body."""

    event_id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    org_id: str = ""
    user_id: str = Field(min_length=1, max_length=256)
    session_id: str = Field(min_length=1, max_length=256)
    turn_index: int = Field(0, ge=0)
    ts_request: datetime
    ts_response: datetime
    requested_model: str = Field(min_length=1)
    model_version: int = Field(ge=1)
    adapter_version: str | None = None
    arm: Literal["champion", "challenger", "pinned"]
    messages: list[dict[str, Any]] | dict[str, Any] | str
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion_logprobs: list[float]
    completion_text: str = ""
    tool_calls: list[dict[str, Any]] | str | None = None
    finish_reason: str | None = None
    latency_ms: float | None = Field(None, ge=0)
    ttft_ms: float | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)

    @field_validator("event_id")
    @classmethod
    def _event_id(cls, v: str) -> str:
        return _uuid(v, "event_id")

    @field_validator("ts_request", "ts_response")
    @classmethod
    def _ts(cls, v: datetime) -> datetime:
        return _utc(v)

    @field_validator("completion_logprobs")
    @classmethod
    def _logprobs(cls, v: list[float]) -> list[float]:
        for i, lp in enumerate(v):
            if math.isnan(lp) or lp > 0:
                raise ValueError(f"completion_logprobs[{i}] = {lp}: a logprob must be <= 0 and not NaN")
        return v

    @model_validator(mode="after")
    def _lengths(self) -> "InteractionEvent":
        if len(self.completion_logprobs) != len(self.completion_token_ids):
            raise ValueError(
                f"completion_logprobs has {len(self.completion_logprobs)} entries but completion_token_ids "
                f"has {len(self.completion_token_ids)}: one logprob per completion token"
            )
        if self.ts_response < self.ts_request:
            raise ValueError("ts_response is before ts_request")
        return self

    def to_row(self) -> dict[str, Any]:
        row = self.model_dump()
        if not isinstance(row["messages"], str):
            row["messages"] = json.dumps(row["messages"], ensure_ascii=False)
        if row["tool_calls"] is not None and not isinstance(row["tool_calls"], str):
            row["tool_calls"] = json.dumps(row["tool_calls"], ensure_ascii=False)
        return row


class FeedbackEvent(Strict):
    """A later reaction to an interaction (event_id)."""

    feedback_id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    event_id: str
    org_id: str = ""
    ts: datetime = Field(default_factory=now_utc)
    kind: Literal[FEEDBACK_KINDS]  # type: ignore[valid-type]
    value_bool: bool | None = None
    value_float: float | None = None
    text: str | None = Field(None, max_length=100_000)

    @field_validator("feedback_id", "event_id")
    @classmethod
    def _ids(cls, v: str, info) -> str:
        return _uuid(v, info.field_name)

    @field_validator("ts")
    @classmethod
    def _ts(cls, v: datetime) -> datetime:
        return _utc(v)

    @field_validator("value_float")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("value_float must be finite")
        return v

    @model_validator(mode="after")
    def _kind_values(self) -> "FeedbackEvent":
        if self.kind == "followup_message" and not self.text:
            raise ValueError("followup_message needs text (the user's next message)")
        if self.kind in ("tool_result", "thumbs") and self.value_bool is None:
            raise ValueError(f"{self.kind} needs value_bool")
        if self.kind == "edit_persisted" and (self.value_float is None or self.value_float < 0):
            raise ValueError("edit_persisted needs value_float = hours observed (>= 0)")
        return self

    def to_row(self) -> dict[str, Any]:
        return self.model_dump()


def to_table(kind: str, rows: list[dict[str, Any]]) -> pa.Table:
    """Rows (dicts as produced by to_row) -> a pyarrow Table with the contract schema."""
    return pa.Table.from_pylist(rows, schema=SCHEMAS[kind])


def conform(kind: str, table: pa.Table) -> pa.Table:
    """Cast a table to the contract schema (column order and types); raises on a missing column."""
    schema = SCHEMAS[kind]
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise ValueError(f"{kind} table lacks columns {missing}")
    return table.select(schema.names).cast(schema)
