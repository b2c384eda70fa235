"""The event contract (design.md, "Events"): pyarrow schemas for the lake, pydantic models for the API.

`interactions`: one row per model completion, with what on-policy RL needs (token ids, the sampled
tokens' logprobs under the sampling distribution actually used, the exact model version).
`feedback`: zero or more later reactions to an interaction.

`adapter_version` (nullable) extends design.md's list: the per-organisation LoRA adapter that served the
turn, if any (docs/architecture.md records the change).

Bounds (below the schemas): every field is held to what its Parquet type can store and what the trainer can
use (integer ranges, finite floats, lengths, no control characters in ids, text UTF-8 can carry). They are
declared here once; the pydantic models, the gateway's request model and headers (rl_core/serving) and the
data-quality gates read them, so a value the lake cannot hold is a 400 naming its field before anything is
generated or stored, instead of an ArrowInvalid in a later compaction that stops every org's events.
"""

from __future__ import annotations

import json
import math
import uuid
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rl_core.ids import check_text_id

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

# --- Bounds: one declaration per field, read by the models below, the gateway (rl_core/serving) and the gates ---
INT32_MAX = 2**31 - 1  # token ids and turn_index are int32 columns
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # model_version is int64; a sampling seed is what vLLM and torch take
FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32: anything beyond is stored as inf
LOGPROB_MAX = 0.0  # the log of a probability; sql/quality/*.sql count a logprob above it as bad ($logprob_max)
TEMPERATURE_MAX = 2.0  # OpenAI's range: the gateway samples within it, and a logged turn's logprobs are under it
LATENCY_MS_MAX = 7 * 24 * 3600 * 1000.0  # a turn "taking" over a week is a clock error, not a latency
MAX_TOKENS = 1 << 20  # token ids in one prompt, or in one completion
MAX_TEXT = 1 << 24  # characters in one text column: the messages JSON, completion_text, the tool_calls JSON
MAX_LABEL = 256  # requested_model, adapter_version, finish_reason
MAX_FEEDBACK_TEXT = 100_000

TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
TurnIndex = Annotated[int, Field(ge=0, le=INT32_MAX)]
ModelVersion = Annotated[int, Field(ge=1, le=INT64_MAX)]
Seed = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
Temperature = Annotated[float, Field(ge=0, le=TEMPERATURE_MAX, allow_inf_nan=False)]
TopP = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
Millis = Annotated[float, Field(ge=0, le=LATENCY_MS_MAX, allow_inf_nan=False)]
TokenIds = Annotated[list[TokenId], Field(max_length=MAX_TOKENS)]


def check_text(field: str, value: str, max_len: int = MAX_TEXT) -> str:
    """Text a column can hold: at most max_len characters, and valid Unicode (JSON may carry a lone UTF-16
    surrogate, U+D800 to U+DFFF, which UTF-8, and so the WAL and Parquet, cannot encode)."""
    if len(value) > max_len:
        raise ValueError(f"{field}: {len(value)} characters, at most {max_len} allowed")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{field}: character {exc.start} is a lone UTF-16 surrogate, which UTF-8 cannot carry") from None
    return value


def check_logprobs(field: str, values: list[float]) -> list[float]:
    """Each a finite float32 <= LOGPROB_MAX (NaN fails every comparison)."""
    for i, lp in enumerate(values):
        if not -FLOAT32_MAX <= lp <= LOGPROB_MAX:
            raise ValueError(f"{field}[{i}] = {lp}: a logprob must be <= {LOGPROB_MAX} and finite (a float32)")
    return values


def _json_text(field: str, value: Any) -> str:
    """A JSON column's value as the text the lake stores, bounded like any text."""
    if isinstance(value, str):
        return check_text(field, value)
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (RecursionError, ValueError, TypeError) as exc:
        raise ValueError(f"{field}: not storable as JSON ({type(exc).__name__})") from None
    return check_text(field, text)


def _uuid(v: str, field: str) -> str:
    try:
        uuid.UUID(str(v))
    except (ValueError, AttributeError, TypeError):
        raise ValueError(f"{field} must be a UUID, got {v!r:.80}") from None
    return str(v)


def _utc(v: datetime) -> datetime:
    return v.replace(tzinfo=timezone.utc) if v.tzinfo is None else v.astimezone(timezone.utc)


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InteractionEvent(Strict):
    """One assistant turn. org_id is set by the server from the bearer token, never from a request body.

    `messages` and `tool_calls` are held as the JSON text the lake stores (a list or dict given is serialised
    once, here), so their length and encoding are checked on exactly what is written."""

    event_id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    org_id: str = ""
    user_id: str
    session_id: str
    turn_index: TurnIndex = 0
    ts_request: datetime
    ts_response: datetime
    requested_model: str
    model_version: ModelVersion
    adapter_version: str | None = None
    arm: Literal["champion", "challenger", "pinned"]
    messages: list[dict[str, Any]] | dict[str, Any] | str
    prompt_token_ids: TokenIds
    completion_token_ids: TokenIds
    completion_logprobs: Annotated[list[float], Field(max_length=MAX_TOKENS)]
    completion_text: str = ""
    tool_calls: list[dict[str, Any]] | str | None = None
    finish_reason: str | None = None
    latency_ms: Millis | None = None
    ttft_ms: Millis | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None

    @field_validator("event_id")
    @classmethod
    def _event_id(cls, v: str) -> str:
        return _uuid(v, "event_id")

    @field_validator("user_id", "session_id")
    @classmethod
    def _caller_ids(cls, v: str, info) -> str:
        return check_text(info.field_name, check_text_id(info.field_name, v))

    @field_validator("requested_model", "adapter_version", "finish_reason")
    @classmethod
    def _labels(cls, v: str | None, info) -> str | None:
        if v is None:  # requested_model is a str by type: only the optional two reach here as None
            return None
        return check_text(info.field_name, check_text_id(info.field_name, v, MAX_LABEL))

    @field_validator("messages", "tool_calls")
    @classmethod
    def _json_columns(cls, v: Any, info) -> str | None:
        return None if v is None else _json_text(info.field_name, v)

    @field_validator("completion_text")
    @classmethod
    def _completion_text(cls, v: str) -> str:
        return check_text("completion_text", v)

    @field_validator("ts_request", "ts_response")
    @classmethod
    def _ts(cls, v: datetime) -> datetime:
        return _utc(v)

    @field_validator("completion_logprobs")
    @classmethod
    def _logprobs(cls, v: list[float]) -> list[float]:
        return check_logprobs("completion_logprobs", v)

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
        return self.model_dump()


class FeedbackEvent(Strict):
    """A later reaction to an interaction (event_id)."""

    feedback_id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    event_id: str
    org_id: str = ""
    ts: datetime = Field(default_factory=now_utc)
    kind: Literal[FEEDBACK_KINDS]  # type: ignore[valid-type]
    value_bool: bool | None = None
    value_float: float | None = None
    text: str | None = Field(None, max_length=MAX_FEEDBACK_TEXT)

    @field_validator("feedback_id", "event_id")
    @classmethod
    def _ids(cls, v: str, info) -> str:
        return _uuid(v, info.field_name)

    @field_validator("text")
    @classmethod
    def _text(cls, v: str | None) -> str | None:
        return None if v is None else check_text("text", v, MAX_FEEDBACK_TEXT)

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
