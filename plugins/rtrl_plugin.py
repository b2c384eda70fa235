"""The rtrl Airflow plugin: registers GridTimetable so the scheduler and API server can load the DAG, and the
listener that writes each finished run's outcome line as its note (rtrl_operators/outcome_note.py).

Airflow imports every .py under the plugins folder as a top-level module named after the file, so the
timetable class must come from the package import (`rtrl_operators.grid_timetable`), the path the DAG
uses: the plugin registry is keyed by that import path, and a copy loaded as module `grid_timetable`
would register a different name. Operators need no registration in Airflow 3.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from rtrl_operators import outcome_note
from rtrl_operators.grid_timetable import GridTimetable


class RtrlPlugin(AirflowPlugin):
    name = "rtrl"
    timetables = [GridTimetable]
    listeners = [outcome_note]
