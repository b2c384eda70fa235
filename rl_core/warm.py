"""Moved to rl_core/runtime/warm.py; this shim keeps `from rl_core import warm` working for the callers not yet
updated (rl_core/simulate/experiment.py). Importing it loads the warm server module: never on the DAG's path."""

from rl_core.runtime.warm import (  # noqa: F401
    JOB_GRACE_S,
    PRELOAD,
    SOCKET_ENV,
    WarmPopen,
    WarmUnavailable,
    popen,
    start_server,
    stop_server,
    wait_ready,
)
