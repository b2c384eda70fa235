"""Process primitives: children in their own sessions (procs) and one streamed job with a deadline (jobs). Every
stop goes through procs.stop_group.

The lab's warm fork server (lab/warm.py, `rtrl experiment`) installs itself as its forks' job launcher
(jobs.use_launcher); the product never imports it (tests/test_runtime.py, tests/test_imports.py check). So the one
name both sides share lives here.
"""

SOCKET_ENV = "RTRL_WARM_SOCKET"  # names a warm server's UNIX socket; unset in production
