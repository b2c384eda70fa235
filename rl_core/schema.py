"""The event contract (design.md, "Events"): pydantic models for the API, and the lake's pyarrow schemas
derived from them (arrow_schema): each field is declared once, and tests/test_schema_pinned.py pins the schemas.

`interactions`: one row per model completion, with what on-policy RL needs (token ids, the sampled
tokens' logprobs under the sampling distribution actually used, the exact model version).
`feedback`: zero or more later reactions to an interaction.

`adapter_version` (nullable) extends design.md's list: the per-organisation LoRA adapter that served the
turn, if any (docs/architecture.md records the change).

Bounds (above the models): every field is held to what its Parquet type can store and what the trainer can
use (integer ranges, finite floats, lengths, no control characters in ids, text UTF-8 can carry). They are
declared here once; the pydantic models, the gateway's request model and headers (rl_core/serving) and the
data-quality gates read them, so a value the lake cannot hold is a 400 naming its field before anything is
generated or stored, instead of an ArrowInvalid in a later compaction that stops every org's events.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

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

# --- Bounds: one declaration per field, read by the models below, the gateway (rl_core/serving) and the gates ---
INT32_MAX = 2**31 - 1  # token ids and turn_index are int32 columns
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # model_version is int64; a sampling seed is what vLLM and torch take
FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32: anything beyond is stored as inf
LOGPROB_MAX = 0.0  # the log of a probability: logprob_problem and BAD_LOGPROBS_SQL (below) refuse above it
TEMPERATURE_MAX = 2.0  # OpenAI's range: the gateway samples within it, and a logged turn's logprobs are under it
LATENCY_MS_MAX = 7 * 24 * 3600 * 1000.0  # a turn "taking" over a week is a clock error, not a latency
MAX_TOKENS = 1 << 20  # token ids in one prompt, or in one completion
MAX_TEXT = 1 << 24  # characters in one text column: the messages JSON, completion_text, the tool_calls JSON
MAX_LABEL = 256  # requested_model, adapter_version, finish_reason
MAX_FEEDBACK_TEXT = 100_000


@dataclass(frozen=True)
class Arrow:
    """A field's lake column type where its Python type does not say it (int32 or int64, float32, a JSON column
    held as text). Pydantic ignores it; arrow_schema reads it, so a field's type is declared once, here."""

    type: pa.DataType


TokenId = Annotated[int, Field(ge=0, le=INT32_MAX), Arrow(pa.int32())]
TurnIndex = Annotated[int, Field(ge=0, le=INT32_MAX), Arrow(pa.int32())]
ModelVersion = Annotated[int, Field(ge=1, le=INT64_MAX), Arrow(pa.int64())]
Seed = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
Temperature = Annotated[float, Field(ge=0, le=TEMPERATURE_MAX, allow_inf_nan=False), Arrow(pa.float32())]
TopP = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False), Arrow(pa.float32())]
Millis = Annotated[float, Field(ge=0, le=LATENCY_MS_MAX, allow_inf_nan=False)]
TokenIds = Annotated[list[TokenId], Field(max_length=MAX_TOKENS)]
Logprobs = Annotated[list[float], Field(max_length=MAX_TOKENS), Arrow(pa.list_(pa.float32()))]
JsonText = Arrow(pa.string())  # a list or dict given is serialised once, by the model's validator


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


def logprob_problem(values: list, n_tokens: int | None = None, field: str = "completion_logprobs") -> str | None:
    """Why `values` are not one turn's logprobs, or None: the one rule every boundary applies (the models
    below, and so /v1/interactions and the gateway's own rows; compaction of the WAL; in DuckDB, the same rule
    as BAD_LOGPROBS_SQL). One logprob per completion token (n_tokens, when given), each a finite float32 <=
    LOGPROB_MAX. No tolerance above 0: the engines' log_softmax is <= 0 in floating point too (x - max <= 0,
    minus the log of a sum that includes exp(0) = 1), so a positive value is a broken engine, not rounding."""
    if n_tokens is not None and len(values) != n_tokens:
        return (f"{field} has {len(values)} entries but completion_token_ids has {n_tokens}: "
                "one logprob per completion token")
    for i, lp in enumerate(values):
        try:
            ok = not isinstance(lp, bool) and -FLOAT32_MAX <= lp <= LOGPROB_MAX  # NaN fails every comparison
        except TypeError:  # None, a string: what a hand-written WAL or Parquet row may hold
            ok = False
        if not ok:
            return f"{field}[{i}] = {lp!r}: a logprob must be <= {LOGPROB_MAX} and finite (a float32)"
    return None


# The same rule in DuckDB, for the queries over Parquet (sql/quality/, the trainer's reader): a macro that
# rl_core.duck.connect defines on every connection. bad_logprobs(list) counts its values that break the rule
# (NULL, NaN, infinite, above LOGPROB_MAX; stored as float32, a value beyond FLOAT32_MAX is infinite); a query
# compares len() with the token count itself. tests/test_logprob_rule.py holds both to the same verdicts.
BAD_LOGPROBS_SQL = ("CREATE OR REPLACE MACRO bad_logprobs(lps) AS "
                    f"len(list_filter(lps, lambda x: x > {LOGPROB_MAX!r} OR isnan(x) OR isinf(x))) "
                    "+ len(lps) - list_count(lps)")


def check_logprobs(field: str, values: list[float], n_tokens: int | None = None) -> list[float]:
    """logprob_problem as a ValueError (what pydantic validators and compaction's quarantine expect)."""
    problem = logprob_problem(values, n_tokens, field)
    if problem:
        raise ValueError(problem)
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
    messages: Annotated[list[dict[str, Any]] | dict[str, Any] | str, JsonText]  # prompt messages and tools
    prompt_token_ids: TokenIds
    completion_token_ids: TokenIds
    completion_logprobs: Logprobs
    completion_text: str = ""
    tool_calls: Annotated[list[dict[str, Any]] | str, JsonText] | None = None  # OpenAI tool calls
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
        check_logprobs("completion_logprobs", self.completion_logprobs, len(self.completion_token_ids))
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


# --- The lake's schemas, derived from the models above: a field is declared once (tests/test_schema_pinned.py
# pins the result, so an edit of a model changes the lake only on purpose) ---
_ARROW_OF = {str: pa.string(), bool: pa.bool_(), int: pa.int64(), float: pa.float64(), datetime: TS}


def _arrow_type(name: str, ann: Any, metadata: tuple | list = ()) -> pa.DataType:
    """The column type of one annotation: an Arrow marker if it carries one, else list[...] element-wise, a
    Literal of strings as a string, or the plain types' map; anything else must say (Arrow) rather than guess."""
    if get_origin(ann) is Annotated:
        ann, metadata = get_args(ann)[0], [*metadata, *ann.__metadata__]
    marked = [m.type for m in metadata if isinstance(m, Arrow)]
    if marked:
        return marked[-1]
    if get_origin(ann) is list:
        return pa.list_(_arrow_type(name, get_args(ann)[0]))
    if get_origin(ann) is Literal and all(isinstance(a, str) for a in get_args(ann)):
        return pa.string()
    if ann in _ARROW_OF:
        return _ARROW_OF[ann]
    raise TypeError(f"{name}: no lake column type for {ann!r}; annotate it with Arrow(...)")


def arrow_schema(model: type[BaseModel]) -> pa.Schema:
    """A model's fields as a lake schema, in declaration order; a field is nullable exactly when None is one of
    its types (a default such as org_id's "" does not make a column nullable)."""
    fields = []
    for name, info in model.model_fields.items():
        ann, nullable = info.annotation, False
        if get_origin(ann) in (Union, UnionType) and type(None) in get_args(ann):
            rest = [a for a in get_args(ann) if a is not type(None)]
            ann, nullable = (rest[0] if len(rest) == 1 else ann), True  # several: only an Arrow marker says
        fields.append(pa.field(name, _arrow_type(name, ann, info.metadata), nullable=nullable))
    return pa.schema(fields)


INTERACTIONS_SCHEMA = arrow_schema(InteractionEvent)
FEEDBACK_SCHEMA = arrow_schema(FeedbackEvent)


def _nullable(schema: pa.Schema, *names: str) -> list[pa.Field]:
    """Columns carried over from another schema with its types: episodes.parquet keeps no column required."""
    return [schema.field(n).with_nullable(True) for n in names]


# The contract of episodes.parquet (the trainer, rewards and gates read it): interaction columns as the lake
# types them, adapter_version the org's LoRA adapter that answered on model_version, temperature and top_p the
# sampling parameters the behaviour logprobs are under; then what harvest adds.
EPISODES_SCHEMA = pa.schema(
    _nullable(INTERACTIONS_SCHEMA, "event_id", "org_id", "user_id", "session_id", "turn_index", "ts_request",
              "model_version", "adapter_version", "arm")
    + [("version_lag", pa.int32())]
    + _nullable(INTERACTIONS_SCHEMA, "messages", "prompt_token_ids", "completion_token_ids", "completion_logprobs",
                "completion_text", "tool_calls", "finish_reason", "latency_ms", "temperature", "top_p")
    + [
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
