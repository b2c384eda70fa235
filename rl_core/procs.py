"""Moved to rl_core/runtime/procs.py; this shim keeps `from rl_core.procs import ...` working (cycle.py,
experiment.py and bench/ import it from here)."""

from rl_core.runtime.procs import exit_on_sigterm, free_port, start, stop, stop_group, wait_http  # noqa: F401
