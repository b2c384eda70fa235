"""Python scorers for what SQL cannot judge well, run over Arrow batches.

- tool calls: is each call well-formed against its tool's JSON schema? Only rows that carry a call are
  parsed (an Arrow filter finds them), with orjson, and each distinct tools list is compiled once into
  fastjsonschema validators (generated Python code: ~4x faster than jsonschema's generic walk over 200k
  calls, bench/harvest_rewards.py); a schema fastjsonschema cannot compile falls back to jsonschema.
- clarifying question and empty/refusal answers: RE2 regexes over the whole column at once.
Broken calls (unparseable JSON, the toolcalls.INVALID name, an unknown tool, arguments that violate the
schema) are flagged so rewards can make them negative examples; they are never dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import fastjsonschema
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from rl_core import toolcalls
from rl_core.rewards.followup import dissatisfied

CLARIFY_CUES = "|".join([
    r"^(which|what|where|when|how|do|does|did|could|can|would|should|is|are|shall)\b[^?]{0,200}\?\s*$",
    r"could you (share|clarify|confirm|tell|paste|provide|show)", r"can you (share|clarify|confirm|paste|provide)",
    r"do you (want|mean|prefer)", r"did you mean", r"what do you mean", r"to clarify", r"which (one|file|version)",
])
REFUSAL = "|".join([
    r"^\s*i('m| am) sorry,? but i (can't|cannot|can not|won't)", r"^\s*i (can't|cannot|won't) (help|assist)",
    r"^\s*as an ai", r"\bi am unable to\b", r"^\s*i('m| am) not able to (help|assist)",
])


def has_tool_calls(tool_calls: pa.Array | pa.ChunkedArray, text: pa.Array | pa.ChunkedArray):
    """A non-empty tool_calls JSON, or call markup left in the text."""
    listed = pc.and_(pc.is_valid(tool_calls), pc.not_equal(pc.utf8_trim_whitespace(tool_calls), "[]"))
    marked = pc.match_substring(text, "<tool_call>")
    return pc.fill_null(pc.or_(pc.fill_null(listed, False), marked), False)


def is_clarifying(text: pa.Array | pa.ChunkedArray, calls: pa.Array | pa.ChunkedArray):
    """A short answer that asks the user a question instead of doing the work (no code, no tool call)."""
    low = pc.utf8_trim_whitespace(pc.utf8_lower(text))
    short = pc.less_equal(pc.utf8_length(low), 400)
    asks = pc.and_(pc.match_substring(low, "?"), pc.match_substring_regex(low, CLARIFY_CUES))
    no_code = pc.invert(pc.match_substring(low, "```"))
    return pc.fill_null(pc.and_(pc.and_(short, asks), pc.and_(no_code, pc.invert(calls))), False)


def is_empty_or_refusal(text: pa.Array | pa.ChunkedArray, calls: pa.Array | pa.ChunkedArray):
    low = pc.utf8_lower(pc.fill_null(text, ""))
    empty = pc.and_(pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(low)), 0), pc.invert(calls))
    return pc.or_(empty, pc.match_substring_regex(low, REFUSAL))


def _compile(schema: dict[str, Any]) -> Callable[[Any], bool]:
    """A predicate args -> valid, from fastjsonschema; jsonschema for what fastjsonschema cannot compile."""
    try:
        check = fastjsonschema.compile(schema)
    except Exception:  # a draft or keyword fastjsonschema lacks: the reference validator decides
        from jsonschema import Draft202012Validator

        return Draft202012Validator(schema).is_valid

    def valid(args: Any) -> bool:
        try:
            check(args)
        except fastjsonschema.JsonSchemaException:
            return False
        return True
    return valid


@lru_cache(maxsize=256)
def _validators(tools_json: str | None) -> dict[str, Any]:
    """tool name -> predicate on the arguments (None when the tool declares no parameters)."""
    if not tools_json:
        return {}
    try:
        tools = orjson.loads(tools_json)
    except orjson.JSONDecodeError:
        return {}
    out: dict[str, Any] = {}
    for t in tools if isinstance(tools, list) else []:
        spec = t.get("function", t) if isinstance(t, dict) else {}
        name, params = spec.get("name"), spec.get("parameters")
        if isinstance(name, str):
            out[name] = _compile(params) if isinstance(params, dict) and params else None
    return out


def call_is_valid(call: dict[str, Any], validators: dict[str, Any]) -> bool:
    fn = call.get("function", call) if isinstance(call, dict) else {}
    name = fn.get("name")
    if not isinstance(name, str) or name == toolcalls.INVALID or name not in validators:
        return False
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = orjson.loads(args) if args.strip() else {}
        except orjson.JSONDecodeError:
            return False
    if not isinstance(args, dict):
        return False
    v = validators[name]
    return v is None or v(args)


def tool_calls_broken(tool_calls: pa.Array | pa.ChunkedArray, text: pa.Array | pa.ChunkedArray,
                      tools_json: pa.Array | pa.ChunkedArray, calls: pa.Array | pa.ChunkedArray) -> pa.Array:
    """True where the turn made at least one malformed call (see module docstring)."""
    out = np.zeros(len(calls), dtype=bool)
    idx = pc.indices_nonzero(calls).to_numpy()
    if not len(idx):
        return pa.array(out)
    sel = pa.array(idx)
    for i, raw, txt, tools in zip(idx, tool_calls.take(sel).to_pylist(), text.take(sel).to_pylist(),
                                  tools_json.take(sel).to_pylist(), strict=True):
        out[i] = not _all_valid(raw, txt, _validators(tools))
    return pa.array(out)


def _all_valid(raw: str | None, text: str | None, validators: dict[str, Any]) -> bool:
    if raw is None or not raw.strip() or raw.strip() == "[]":
        parsed = toolcalls.parse(text or "")[1]  # calls left in the text only
    else:
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return False
    if not isinstance(parsed, list) or not parsed:
        return False
    return all(call_is_valid(c, validators) for c in parsed)


def score_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Columns rn, completion_text, tool_calls, tools_json, followup_text -> per-row scorer outputs."""
    text, calls_col = batch.column("completion_text"), batch.column("tool_calls")
    calls = has_tool_calls(calls_col, pc.fill_null(text, ""))
    return pa.record_batch({
        "rn": batch.column("rn"),
        "has_tool_calls": calls,
        "broken_tool_call": tool_calls_broken(calls_col, text, batch.column("tools_json"), calls),
        "is_clarifying": is_clarifying(pc.fill_null(text, ""), calls),
        "empty_or_refusal": is_empty_or_refusal(text, calls),
        "dissatisfied": dissatisfied(batch.column("followup_text")),
    })
