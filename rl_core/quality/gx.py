"""A thin layer over Great Expectations: run a list of checks on a DataFrame, explain every failure.

GX is imported lazily (it takes seconds) and only ever validates DataFrames produced by DuckDB (GX over
DuckDB via SQLAlchemy fails, stack-notes). Each failing expectation becomes one readable line with its
count, share and example ids/values, which is what GateFailed prints and the verdict stores. `unexpected` applies
a row-level check's rule to each row, so a gate can tell whose rows break it (gates.gate_raw's quarantine).
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Check:
    """One expectation: a GX class name from great_expectations.expectations, its kwargs, and what it means."""

    expectation: str
    kwargs: dict[str, Any]
    why: str


@dataclass
class Outcome:
    success: bool
    failures: list[str] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)  # the GX validation result as JSON


_CTX = None

# GX talks at INFO, and a task log shows INFO: its public-API registry alone (logger
# great_expectations._docs_decorators) logs "Skipping registering function ... because it is a closure" for
# ~220 functions on import, then come metric re-declarations (.expectations.registry) and the ephemeral docs
# site (.data_context.types.base, which GX pins to INFO itself), all before the gate's verdict. GX's
# warnings and errors still show. Called before GX is imported and again once it is (for the pinned ones).
GX_LOGGER = "great_expectations"


def _quiet_gx() -> None:
    logging.getLogger(GX_LOGGER).setLevel(logging.WARNING)
    for name, lg in list(logging.Logger.manager.loggerDict.items()):
        if name.startswith(GX_LOGGER + ".") and isinstance(lg, logging.Logger) and 0 < lg.level < logging.WARNING:
            lg.setLevel(logging.NOTSET)  # inherit WARNING


def _context():
    global _CTX
    if _CTX is None:
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
        _quiet_gx()
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        _quiet_gx()
        _CTX = gx.get_context(mode="ephemeral")
        _CTX.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    return _CTX


def validate(df, checks: list[Check], name: str, id_column: str | None = "event_id") -> Outcome:
    """Validate df against checks; the id column (if present) gives example ids for each failure."""
    _quiet_gx()  # before the first import of great_expectations
    import great_expectations as gx
    import great_expectations.expectations as gxe

    ctx = _context()
    tag = f"{name}-{uuid.uuid4().hex[:8]}"
    suite = ctx.suites.add(gx.ExpectationSuite(name=tag))
    why: dict[str, str] = {}
    for c in checks:
        exp = suite.add_expectation(getattr(gxe, c.expectation)(**c.kwargs))
        why[str(exp.id)] = c.why
    bd = ctx.data_sources.add_pandas(tag).add_dataframe_asset(tag).add_batch_definition_whole_dataframe(tag)
    fmt: dict[str, Any] = {"result_format": "SUMMARY", "partial_unexpected_count": 5}
    if id_column and id_column in df.columns:
        fmt["unexpected_index_column_names"] = [id_column]
    try:
        res = bd.get_batch(batch_parameters={"dataframe": df}).validate(suite, result_format=fmt)
    finally:
        ctx.suites.delete(tag)
        ctx.data_sources.delete(tag)
    failures = [_explain(r, why.get(str(r.expectation_config.id), ""), id_column) for r in res.results
                if not r.success]
    return Outcome(success=bool(res.success), failures=failures, result=res.to_json_dict())


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _explain(r, why: str, id_column: str | None) -> str:
    cfg = r.expectation_config
    kwargs = {k: v for k, v in cfg.kwargs.items() if k != "batch_id"}
    target = kwargs.pop("column", None) or (f"{kwargs.pop('column_A', '')}={kwargs.pop('column_B', '')}"
                                             if "column_A" in kwargs else "table")
    head = f"{why} [{cfg.type}({target}{', ' if kwargs else ''}{', '.join(f'{k}={_short(v)}' for k, v in kwargs.items())})]"
    res = r.result or {}
    if r.exception_info and r.exception_info.get("raised_exception"):
        return f"{head}: could not be evaluated: {r.exception_info.get('exception_message')}"
    if "unexpected_count" in res:
        n, total = res.get("unexpected_count", 0), res.get("element_count", 0)
        line = f"{head}: {n} of {total} rows unexpected"
        idx = res.get("partial_unexpected_index_list") or []
        ids = [row.get(id_column) for row in idx if isinstance(row, dict) and id_column in row][:3]
        vals = [str(v) for v in (res.get("partial_unexpected_list") or [])[:3]]
        if vals and target != id_column:
            line += f", e.g. values {', '.join(vals)}"
        if ids:
            line += f" ({id_column} {', '.join(map(str, ids))})"
        return line
    return f"{head}: observed {_short(res.get('observed_value'))}"


def unexpected(df, check: Check):
    """The rows of df that a row-level check finds unexpected, as a boolean Series: the rule GX applies (nulls
    are not judged by a value expectation; a pair is equal when both are present and equal), so a gate can say
    whose rows they are. Table-level expectations (row counts, uniqueness) have no such rows: ValueError."""
    k, e = check.kwargs, check.expectation
    if e == "ExpectColumnValuesToNotBeNull":
        return df[k["column"]].isna()
    if e == "ExpectColumnPairValuesToBeEqual":
        a, b = df[k["column_A"]], df[k["column_B"]]
        return ~(a == b) & ~(a.isna() & b.isna())
    col = df[k["column"]]
    if e == "ExpectColumnValuesToBeInSet":
        return col.notna() & ~col.isin(k["value_set"])
    if e == "ExpectColumnValuesToBeBetween":
        lo, hi = k.get("min_value"), k.get("max_value")
        return col.notna() & ((col < lo if lo is not None else False) | (col > hi if hi is not None else False))
    raise ValueError(f"{e} is not a row-level expectation")
