"""Every finished run of an rtrl DAG gets its outcome line as its note, whoever made the run.

The DAG's last task, `outcome`, returns one line (`skipped: why`, `refused by <gate>: why`, `registered vN ->
challenger`, the A/B decision with per-arm counts). Airflow shows a run's note under the run page's header, but a
task cannot set it: Airflow 3 tasks reach the metadata DB only through the Task SDK, which
has no note API. The scheduler can: Airflow calls this listener from `DagRun.update_state` when a run ends, inside
the scheduler's session (and `dag.test()`'s), so a scheduled run, a backfill, a manual run from the UI and
`rtrl cycle`'s run all read the same line where an operator looks first. A note someone already wrote stays.
"""

from __future__ import annotations

import json
import logging

from airflow.listeners import hookimpl

OUTCOME_TASK = "outcome"
log = logging.getLogger(__name__)


def outcome_line(value: object) -> str | None:
    """The outcome task's return value as stored in the XCom table (JSON-encoded once more by the Task SDK)."""
    if isinstance(value, str) and value.startswith('"'):
        value = json.loads(value)
    return value if isinstance(value, str) and value else None


def note_outcome(dag_run) -> str | None:
    """Set dag_run's note to its `outcome` task's line, unless it has no such task or already has a note. In the
    scheduler's session when the run is bound to one; else (dag.test() hands a detached run) in a session of its own."""
    from airflow.models.dagrun import DagRun  # lazy: the listener loads in every Airflow process
    from airflow.utils.session import create_session
    from sqlalchemy import select
    from sqlalchemy.orm import object_session

    if (session := object_session(dag_run)) is not None:
        return _note(session, dag_run)
    with create_session() as own:  # committed on exit
        run = own.scalar(select(DagRun).where(DagRun.dag_id == dag_run.dag_id, DagRun.run_id == dag_run.run_id))
        return None if run is None else _note(own, run)


def _note(session, run) -> str | None:
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    if run.note:
        return None
    value = session.scalar(select(XComModel.value).where(
        XComModel.dag_id == run.dag_id, XComModel.run_id == run.run_id, XComModel.task_id == OUTCOME_TASK,
        XComModel.key == "return_value", XComModel.map_index == -1))
    if line := outcome_line(value):
        run.note = line[:1000]  # committed with the session's transaction
    return line


@hookimpl
def on_dag_run_success(dag_run, msg: str) -> None:
    try:
        note_outcome(dag_run)
    except Exception:  # a note must never stop the scheduler
        log.exception("rtrl: could not set the outcome note of %s", dag_run.run_id)


@hookimpl
def on_dag_run_failed(dag_run, msg: str) -> None:
    try:
        note_outcome(dag_run)
    except Exception:
        log.exception("rtrl: could not set the outcome note of %s", dag_run.run_id)
