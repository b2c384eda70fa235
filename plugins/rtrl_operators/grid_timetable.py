"""GridTimetable: data intervals on rtrl's window grid, for scheduled runs, backfills and manual runs alike.

Why not `DeltaDataIntervalTimetable(timedelta(hours=5))`: with catchup off it floors "now" to multiples of
5 h since 1970, one hour off the grid rtrl's run ids and docs use (anchor 2026-01-01T00:00Z, rl_core/window.py),
and a backfill's windows start wherever `from_date` happens to be. Scheduled windows then straddle backfilled
ones and harvest the same turns twice. Here every interval is [anchor + k*period, anchor + (k+1)*period):
- scheduled (catchup off): the latest complete grid interval, then each next one;
- backfill from..to: every grid interval that lies inside [from, to] (a misaligned `from` moves up to the
  next grid point, a misaligned `to` down to the previous one), so `--from-date 04:00 --to-date 09:00`
  is the one window [04:00, 09:00);
- a manual run with a logical date and no data interval of its own: the latest complete grid interval ending at
  or before that date (a trigger that names its data interval, UI "Specify Manually" or REST
  data_interval_start/_end, keeps it: Airflow does not ask the timetable then);
- `dag.test()` of a DAG object whose timetable has `manual_window` set (lab.cycle.dag_test, `rtrl cycle`'s
  in-process path): exactly that window, since `dag.test()` can only infer its run's data interval.

A custom timetable must be registered by a plugin under the same import path the DAG uses
(plugins/rtrl_plugin.py registers `rtrl_operators.grid_timetable.GridTimetable`); otherwise the DAG does not
serialize ("Timetable class ... is not registered").
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pendulum
from airflow.exceptions import AirflowTimetableInvalid
from airflow.timetables.base import DagRunInfo, DataInterval, TimeRestriction, Timetable

from rl_core.window import SCHEDULE_ANCHOR, grid_ceil, grid_floor


def _aware(ts: datetime) -> pendulum.DateTime:
    """Airflow hands timetables pendulum DateTimes and expects them back."""
    return pendulum.instance(ts.astimezone(UTC))


def _plain(ts: datetime) -> datetime:
    """A stdlib datetime in UTC (pendulum's differences are Intervals, which timedelta arithmetic refuses)."""
    return datetime.fromtimestamp(ts.timestamp(), UTC)


class GridTimetable(Timetable):
    """Data intervals of `hours` hours on the grid anchored at `anchor` (UTC)."""

    periodic = True
    # Set only on a DAG object about to run `dag.test()` in this process (lab.cycle.dag_test): that run's data
    # interval, which dag.test() can only ask the timetable for. Not serialized: no scheduler ever sees it.
    manual_window: tuple[datetime, datetime] | None = None

    def __init__(self, hours: int, anchor: datetime = SCHEDULE_ANCHOR) -> None:
        if anchor.tzinfo is None:
            raise ValueError(f"anchor {anchor.isoformat()} must be timezone-aware")
        self.hours = int(hours)
        self.anchor = _plain(anchor)
        self.description = f"every {self.hours} h on the grid anchored at {self.anchor:%Y-%m-%dT%H:%MZ}"

    # --- the grid ---------------------------------------------------------------------------------------
    @property
    def period(self) -> timedelta:
        return timedelta(hours=self.hours)

    def floor(self, ts: datetime) -> datetime:
        return grid_floor(_plain(ts), self.hours, self.anchor)

    def ceil(self, ts: datetime) -> datetime:
        return grid_ceil(_plain(ts), self.hours, self.anchor)

    def _interval(self, start: datetime) -> DagRunInfo:
        return DagRunInfo.interval(start=_aware(start), end=_aware(start + self.period))

    # --- the Timetable protocol ---------------------------------------------------------------------------
    @property
    def summary(self) -> str:
        return f"{self.hours}h grid"

    def validate(self) -> None:
        if self.hours < 1:
            raise AirflowTimetableInvalid(f"GridTimetable: hours must be >= 1, got {self.hours}")

    def serialize(self) -> dict[str, Any]:
        return {"hours": self.hours, "anchor": self.anchor.isoformat()}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> GridTimetable:
        return cls(int(data["hours"]), datetime.fromisoformat(data["anchor"]))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GridTimetable) and (self.hours, self.anchor) == (other.hours, other.anchor)

    def __hash__(self) -> int:
        return hash((self.hours, self.anchor))

    def infer_manual_data_interval(self, *, run_after: datetime) -> DataInterval:
        if self.manual_window is not None:
            start, end = self.manual_window
            return DataInterval(start=_aware(start), end=_aware(end))
        end = self.floor(run_after)
        return DataInterval(start=_aware(end - self.period), end=_aware(end))

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
    ) -> DagRunInfo | None:
        earliest = self.ceil(restriction.earliest) if restriction.earliest is not None else None
        if not restriction.catchup:  # only the latest complete interval, never the ones missed before it
            latest_start = self.floor(datetime.now(UTC)) - self.period
            earliest = latest_start if earliest is None else max(earliest, latest_start)
        if last_automated_data_interval is None:
            if earliest is None:
                return None
            start = earliest
        else:
            start = self.ceil(last_automated_data_interval.end)  # realigns after a change of grid
            start = max(start, self.floor(last_automated_data_interval.start) + self.period)
            if earliest is not None:
                start = max(start, earliest)
        if restriction.latest is not None and start + self.period > restriction.latest:
            return None  # a backfill's `to` ends the last whole window, it does not start one
        return self._interval(start)
