"""The schedule's grid and a cycle's harvest window, in one place for every part that needs them.

Grid windows are [SCHEDULE_ANCHOR + k*period, SCHEDULE_ANCHOR + (k+1)*period), UTC, with period
`[airflow] schedule_hours`. The Airflow timetable (plugins/rtrl_operators/grid_timetable.py) puts scheduled
runs, backfills and manual runs with a logical date on this grid, the DAG's `window` task turns the data
interval into the harvest window and its run id, and `rtrl cycle` names its run ids the same way. Why one
grid: a window that straddles two scheduled ones harvests turns they harvest too (Airflow's own delta
timetable floors to multiples of the period since 1970, which for 5 h is one hour off this anchor).
A run's data interval is its harvest window, whatever started it: a manual run names its own window as its data
interval (the trigger form's Data Interval "Specify Manually", REST data_interval_start/_end, `rtrl cycle`), and a
run without a data interval (a trigger without a logical date) may name one with the start/end params; params that
disagree with a data interval, and params that mean nothing for a backfill, are refused (resolve_window). The
episode ledger (rl_core/ledger.py) keeps overlapping windows from training an episode twice. A window is at most
`[harvest] max_window_hours` long (check_window, the one check: resolve_window for the DAGs, rl_core/cli.py for
every command's --start/--end): a harvest walks every hour partition of its window, and the DAG's params alone
once let a manual run name the years 0001 to 9999.

Stdlib only: the timetable plugin imports this in the scheduler and the API server.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from rl_core.ids import check_run_id

# The schedule's anchor: windows are [ANCHOR + k*schedule, ANCHOR + (k+1)*schedule), UTC.
SCHEDULE_ANCHOR = datetime(2026, 1, 1, tzinfo=UTC)
# The longest window a run may harvest, unless [harvest] max_window_hours says otherwise: a week of hours.
MAX_WINDOW_HOURS = 168
# What a DAG's start/end params accept at trigger time (JSON schema: an ECMA regex, which Airflow runs with Python's
# re.search): an ISO-8601 timestamp of the years 2000-2099 with its timezone (Z or +HH:MM); the run's window task
# then applies check_window. (?!.*\s): no white space anywhere, since `$` also matches before a final newline.
PARAM_TS_PATTERN = (r"^(?!.*\s)20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9](:[0-5][0-9](\.[0-9]{1,6})?)?"
                    r"(Z|[+-][0-2][0-9]:[0-5][0-9])$")
PARAM_TS_MAX_LEN = 32
PARAM_TS_HELP = ("manual window {} (UTC ISO 8601 with its timezone, e.g. 2026-12-02T10:00:00+00:00; a window is at "
                 "most [harvest] max_window_hours long)")
# The params a single run may set and a backfill may not: each backfill run harvests its grid window and updates the
# champion (only dry_run and map_hours apply to it).
SINGLE_RUN_PARAMS = ("start", "end", "policy_version")


class WindowError(ValueError):
    """A window that cannot be harvested (empty, reversed, longer than harvest.max_window_hours, or named by params
    that disagree with the run's data interval), or params a backfill run refuses."""


@dataclass(frozen=True)
class Window:
    start: datetime
    end: datetime
    run_id: str

    def __post_init__(self) -> None:
        check_run_id(self.run_id)
        if self.end <= self.start:
            raise WindowError(f"window end {self.end.isoformat()} must be after start {self.start.isoformat()}")

    def to_xcom(self, **extra: Any) -> dict[str, Any]:
        """The window as a task's return value (JSON: ISO timestamps), with the run's other values."""
        return {"run_id": self.run_id, "start": self.start.isoformat(), "end": self.end.isoformat(), **extra}

    @classmethod
    def from_xcom(cls, value: dict[str, Any]) -> Window:
        """The window back from an upstream task's return value (the other keys are left to the caller)."""
        return cls(_parse_ts("start", value["start"]), _parse_ts("end", value["end"]), value["run_id"])


@dataclass(frozen=True)
class CycleRun:
    """What every task of a cycle's DAG run reads: the window and the run's params, one typed value. On the
    wire (XCom) it is the JSON dict to_xcom makes, which the gate operators read by key; each task turns it
    back into this with from_xcom, so no task indexes the run's values or parses the window itself."""

    window: Window
    dry_run: bool = False
    policy_version: int | None = None  # the param until harvest.plan resolves it (then the version updated)
    map_hours: int | None = None  # the param; None: [harvest] map_hours
    airflow_run_id: str = ""

    @property
    def run_id(self) -> str:
        return self.window.run_id

    def to_xcom(self, **extra: Any) -> dict[str, Any]:
        return self.window.to_xcom(dry_run=self.dry_run, policy_version=self.policy_version,
                                   map_hours=self.map_hours, airflow_run_id=self.airflow_run_id, **extra)

    @classmethod
    def from_xcom(cls, value: dict[str, Any]) -> CycleRun:
        policy, hours = value.get("policy_version"), value.get("map_hours")
        return cls(Window.from_xcom(value), bool(value.get("dry_run")), None if policy is None else int(policy),
                   None if hours is None else int(hours), str(value.get("airflow_run_id") or ""))

    @property
    def policy(self) -> int:
        """The version this run updates (set by harvest.plan)."""
        if self.policy_version is None:
            raise ValueError(f"run {self.run_id}: no policy version resolved yet")
        return self.policy_version


def _parse_ts(name: str, value: Any) -> datetime:
    if isinstance(value, datetime):
        ts = value
    else:
        try:
            ts = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"param {name}={value!r}: not an ISO-8601 timestamp") from None
    if ts.tzinfo is None:
        raise ValueError(f"param {name}={value!r}: needs a timezone (e.g. 2026-12-02T10:00:00+00:00)")
    try:
        return ts.astimezone(UTC)
    except OverflowError:  # year 1 or 9999 shifted past the calendar's end by its offset
        raise ValueError(f"param {name}={value!r}: out of range") from None


def check_window(start: datetime, end: datetime, max_hours: float = MAX_WINDOW_HOURS) -> None:
    """Refuse a window that is empty, reversed, or longer than max_hours ([harvest] max_window_hours)."""
    if end <= start:
        raise WindowError(f"window end {end.isoformat()} must be after start {start.isoformat()}")
    if end - start > timedelta(hours=max_hours):
        hours = (end - start) / timedelta(hours=1)
        raise WindowError(f"window [{start.isoformat()}, {end.isoformat()}) spans {hours:g} hours; at most "
                          f"{max_hours:g} allowed (harvest.max_window_hours; RTRL_HARVEST__MAX_WINDOW_HOURS)")


def _stamp(ts: datetime) -> str:
    return ts.strftime("%Y%m%dT%H%M%S" if ts.second or ts.microsecond else "%Y%m%dT%H%M")


def run_id_for(start: datetime, end: datetime, schedule_hours: int) -> str:
    """cycle-<end> for a scheduled-length window, cycle-<start>-<end> otherwise: same window, same id."""
    if end - start == timedelta(hours=schedule_hours):
        return f"cycle-{_stamp(end)}"
    return f"cycle-{_stamp(start)}-{_stamp(end)}"


def grid_floor(ts: datetime, schedule_hours: int, anchor: datetime = SCHEDULE_ANCHOR) -> datetime:
    """The latest grid point at or before ts (ts must be timezone-aware)."""
    step = timedelta(hours=schedule_hours)
    return anchor + ((ts - anchor) // step) * step


def grid_ceil(ts: datetime, schedule_hours: int, anchor: datetime = SCHEDULE_ANCHOR) -> datetime:
    """The earliest grid point at or after ts."""
    floor = grid_floor(ts, schedule_hours, anchor)
    return floor if floor == ts else floor + timedelta(hours=schedule_hours)


def on_grid(ts: datetime, schedule_hours: int, anchor: datetime = SCHEDULE_ANCHOR) -> bool:
    return grid_floor(ts, schedule_hours, anchor) == ts


def latest_window_end(now: datetime, schedule_hours: int) -> datetime:
    return grid_floor(now, schedule_hours)


def check_backfill_params(params: dict[str, Any]) -> None:
    """Refuse the single-run params (SINGLE_RUN_PARAMS) on a backfill run: its window is its grid interval and it
    updates the champion, so a start, end or policy_version given to the backfill would be silently ignored."""
    given = {k: params[k] for k in SINGLE_RUN_PARAMS if params.get(k) is not None}
    if given:
        raise WindowError(f"a backfill run harvests its grid window and updates the champion: param(s) "
                          f"{', '.join(f'{k}={v}' for k, v in given.items())} mean nothing for a backfill; create it "
                          "again without them (only dry_run and map_hours apply to a backfill)")


def _disagree(s: datetime, e: datetime, ds: datetime, de: datetime) -> WindowError:
    return WindowError(
        f"params start/end name the window [{s.isoformat()}, {e.isoformat()}) but this run's data interval, which "
        f"Airflow shows as its window, is [{ds.isoformat()}, {de.isoformat()}): the data interval is the harvest "
        "window. Trigger again with Data Interval 'Specify Manually' set to the window and start/end left empty "
        "(REST: data_interval_start/data_interval_end with a logical_date), or clear the Logical Date (no data "
        "interval) to name the window with start/end alone")


def resolve_window(
    params: dict[str, Any],
    interval_start: datetime | None,
    interval_end: datetime | None,
    schedule_hours: int,
    now: datetime | None = None,
    max_hours: float = MAX_WINDOW_HOURS,
    run_type: str | None = None,
) -> Window:
    """The harvest window: the `start`/`end` params when given, else the data interval, else the last
    complete scheduled interval (a manual trigger without a logical date has no data interval). A window
    longer than max_hours (the DAGs pass [harvest] max_window_hours) is refused with WindowError.
    run_type (realtime_rl passes its run's: manual, scheduled, backfill, ...) makes the data interval the window
    for every run that has one: start/end that name another window are refused, and so is every single-run
    param of a backfill run (check_backfill_params). None keeps the params-first rule (realtime_rl_orgs)."""
    if run_type == "backfill":
        check_backfill_params(params)
    start, end = params.get("start"), params.get("end")
    if (start is None) != (end is None):
        raise ValueError("params start and end go together: give both or neither")
    has_interval = interval_start is not None and interval_end is not None and interval_end > interval_start
    if has_interval:
        ds, de = _parse_ts("data_interval_start", interval_start), _parse_ts("data_interval_end", interval_end)
    if start is not None:
        s, e = _parse_ts("start", start), _parse_ts("end", end)
        if run_type is not None and has_interval and (s, e) != (ds, de):
            raise _disagree(s, e, ds, de)
    elif has_interval:
        s, e = ds, de
    else:
        e = latest_window_end(now or datetime.now(UTC), schedule_hours)
        s = e - timedelta(hours=schedule_hours)
    check_window(s, e, max_hours)
    return Window(s, e, run_id_for(s, e, schedule_hours))
