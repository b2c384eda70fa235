"""DataQualityGateOperator: run one rtrl check and fail the task, with its full report, when it refuses.

Every check of a cycle (the Great Expectations gates, the reward-hacking monitors, the promotion gate)
returns an rl_core.reports.Verdict or raises GateFailed carrying one. This operator turns either into
Airflow semantics: a refusal raises AirflowFailException, which fails the task *without retries*
(re-running a deterministic check on the same data cannot change its answer), so every downstream task
ends `upstream_failed` and nothing is promoted. The report (each failed expectation, its counts and
sample values) goes to the task log, and the verdict file stays in the lake for the promotion gate.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from rl_core.config import load_config
from rl_core.pipeline import GATES, callable_of
from rl_core.reports import GateFailed

# check name -> ("module:function", positional argument names after cfg): the cycle's gates, defined once
CHECKS: dict[str, tuple[str, tuple[str, ...]]] = {g.name: (g.call, g.args) for g in GATES}
_DATETIME_ARGS = ("start", "end", "since", "until")


class DataQualityGateOperator(BaseOperator):
    """Run `check` on a cycle's window and fail the task (no retry) when the verdict does not pass.

    :param check: a name from CHECKS, or any name when `callable_path` is given.
    :param window: dict with the values the check needs (run_id, start, end as ISO strings, ...);
        templated, so an XComArg from an upstream task works.
    :param callable_path: 'module:function' taking (cfg, *args) and returning a Verdict (or raising
        GateFailed); lets other DAGs gate on their own checks.
    :param arg_names: the keys of `window`/`extra` passed positionally after cfg.
    :param extra: more values for the arguments (templated), e.g. {"parent_version": XComArg}.
    """

    template_fields: Sequence[str] = ("window", "extra")
    ui_color = "#f9e79f"

    def __init__(
        self,
        *,
        check: str,
        window: Any,
        callable_path: str | None = None,
        arg_names: Sequence[str] | None = None,
        extra: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if callable_path is None and check not in CHECKS:
            raise ValueError(f"check {check!r}: unknown; choose one of {sorted(CHECKS)} or pass callable_path")
        kwargs.setdefault("retries", 0)
        super().__init__(**kwargs)
        self.check = check
        default_path, default_args = CHECKS.get(check, ("", ()))
        self.callable_path = callable_path or default_path
        self.arg_names = tuple(arg_names if arg_names is not None else default_args)
        self.window = window
        self.extra = extra or {}

    def _args(self) -> list[Any]:
        values = {**(self.window or {}), **(self.extra or {})}
        missing = [n for n in self.arg_names if n not in values]
        if missing:
            raise AirflowFailException(f"{self.check}: missing argument(s) {missing}; got keys {sorted(values)}")
        out = []
        for name in self.arg_names:
            value = values[name]
            if name in _DATETIME_ARGS and isinstance(value, str):
                value = datetime.fromisoformat(value)
            out.append(value)
        return out

    def execute(self, context: Any) -> dict[str, Any]:
        args = self._args()  # bad input fails before anything is imported or read
        cfg = load_config()
        fn = callable_of(self.callable_path)
        try:
            verdict = fn(cfg, *args)
        except GateFailed as exc:
            verdict = exc.verdict
        if verdict is None or not hasattr(verdict, "passed"):
            raise AirflowFailException(f"{self.callable_path} returned {verdict!r}, not a Verdict")
        # the reason first: it is the line a person opening the failed task's log reads (Airflow 3 gives a task
        # no API to set its own note); then the call, then the full report
        (self.log.info if verdict.passed else self.log.error)("%s", headline(verdict))
        self.log.info("check %s: %s(cfg, %s)\n%s", self.check, self.callable_path, ", ".join(map(repr, args)),
                      report(verdict))
        if not verdict.passed:
            reasons = "\n  - ".join(verdict.reasons or ["(no reason given)"])
            raise AirflowFailException(f"{verdict.name} refused the cycle:\n  - {reasons}")
        return {"name": verdict.name, "passed": True, "reasons": list(verdict.reasons)}


def headline(verdict: Any) -> str:
    """One line: the verdict and, when it refuses, every reason (`; `-joined)."""
    if verdict.passed:
        return f"{verdict.name} PASSED"
    return f"{verdict.name} refused the cycle: " + "; ".join(verdict.reasons or ["(no reason given)"])


def report(verdict: Any) -> str:
    """The verdict as readable text: reasons first, then the details (the GX results) as JSON."""
    lines = [f"  - {r}" for r in verdict.reasons] or ["  (every check passed)"]
    details = json.dumps(verdict.details, indent=2, default=str, sort_keys=True) if verdict.details else "{}"
    return "\n".join(lines) + "\ndetails:\n" + details
