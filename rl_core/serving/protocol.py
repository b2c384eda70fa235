"""OpenAI wire format: strict request models, response/chunk builders and the JSON error shape.

Requests are validated strictly (unknown fields -> 400 naming them), so a typo such as `max_token`
is reported instead of silently ignored; numbers and texts use the event contract's bounds (rl_core/schema.py),
so a request whose turn could not be logged is refused before any token is generated. Errors use OpenAI's shape {"error": {message, type, param,
code}}, which the official SDK turns into its typed exceptions.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import orjson
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rl_core.ids import check_text_id
from rl_core.schema import MAX_LABEL, Seed, Temperature, TopP, check_text

MAX_ERRORS = 5  # fields listed in one 400's message (a list of a million bad token ids is one line, not a million)
# OpenAI's limits on `metadata`: up to 16 pairs, keys up to 64 characters, values up to 512
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512

class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> JSONResponse:
        kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                413: "invalid_request_error", 409: "conflict_error", 503: "service_unavailable"}.get(self.status, "api_error")
        return JSONResponse({"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}},
                            status_code=self.status)


def validation_error(exc: ValidationError, prefix: str = "") -> ApiError:
    """A pydantic error -> 400 naming every bad field (first one as `param`)."""
    parts, first, errors = [], None, exc.errors()
    for e in errors[:MAX_ERRORS]:
        loc = ".".join(str(x) for x in (prefix, *e["loc"]) if x != "")
        first = first or loc
        parts.append(f"{loc}: {e['msg']}")
    more = f" (and {len(errors) - MAX_ERRORS} more)" if len(errors) > MAX_ERRORS else ""
    return ApiError(400, "invalid request: " + "; ".join(parts) + more, param=first, code="invalid_value")


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None  # echoed back by SDK users who pass a response message as-is
    function_call: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    annotations: list[Any] | None = None


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    max_tokens: int | None = Field(None, gt=0)
    max_completion_tokens: int | None = Field(None, gt=0)
    stop: str | list[str] | None = None
    seed: Seed | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    n: Literal[1] | None = None
    logprobs: bool | None = None
    top_logprobs: Literal[0] | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 4:
            raise ValueError("at most 4 stop sequences")
        for s in [v] if isinstance(v, str) else v or []:
            check_text("stop", s, MAX_LABEL)
        return v

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        return check_text("model", check_text_id("model", v, MAX_LABEL), MAX_LABEL)

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        return check_text_id("user", v) if v else v  # "" counts as absent, as before

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is not None and len(v) > METADATA_PAIRS:
            raise ValueError(f"at most {METADATA_PAIRS} pairs, got {len(v)}")
        for key, value in (v or {}).items():
            check_text(f"metadata key {key[:METADATA_KEY]!r}", key, METADATA_KEY)
            check_text(f"metadata.{key}", value, METADATA_VALUE)
        return v

    @field_validator("tools")
    @classmethod
    def _tools(cls, v: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for i, t in enumerate(v or []):
            fn = t.get("function") if isinstance(t, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise ValueError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}")
        return v

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


def _logprobs_block(tokenizer, token_ids: list[int], logprobs: list[float]) -> dict:
    return {"content": [{"token": tokenizer.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                        for t, lp in zip(token_ids, logprobs, strict=True)]}


def completion_body(*, event_id: str, model: str, created: int, content: str | None, tool_calls: list,
                    finish_reason: str, prompt_tokens: int, completion_tokens: int, logprobs: dict | None) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": f"chatcmpl-{event_id}", "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": logprobs}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def chunk(event_id: str, model: str, created: int, delta: dict, finish_reason: str | None = None,
          usage: dict | None = None, choices: bool = True) -> bytes:
    body: dict[str, Any] = {"id": f"chatcmpl-{event_id}", "object": "chat.completion.chunk", "created": created,
                            "model": model,
                            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]
                            if choices else []}
    if usage is not None:
        body["usage"] = usage
    return b"data: " + orjson.dumps(body) + b"\n\n"  # orjson: a tenth of json.dumps' cost, once per streamed token


def now_s() -> int:
    return int(time.time())


logprobs_block = _logprobs_block
