"""Process primitives: children in their own sessions (procs), one streamed job with a deadline (jobs), and the
dev-only warm fork server (warm). Every stop goes through procs.stop_group.

The warm server is imported only where a warm socket is named (`rtrl experiment`): parsing the DAG, a
production task and `rtrl train` never load it (tests/test_runtime.py checks). So the one name both sides
share lives here, not in warm.py.
"""

SOCKET_ENV = "RTRL_WARM_SOCKET"  # names a warm server's UNIX socket; unset in production
