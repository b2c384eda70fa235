"""rl_core.runtime.procs.exit_on_sigterm: SIGTERM unwinds (finally blocks run) and the exit code says "terminated"."""

import os
import signal
import time

import pytest

from rl_core.runtime.procs import exit_on_sigterm


def _sigterm_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # the handler raises in here
    raise AssertionError("SIGTERM did not interrupt")


def test_sigterm_unwinds_with_exit_code_143_and_restores_the_handler():
    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    with pytest.raises(SystemExit) as e:
        with exit_on_sigterm():
            try:
                _sigterm_self()
            finally:
                cleaned.append(1)
    assert e.value.code == 143 and cleaned == [1]
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_cleanup_that_raises_after_sigterm_still_exits_143(capsys):
    """The SystemExit lands wherever the main thread was; a finally there may raise in its place."""
    with pytest.raises(SystemExit) as e:
        with exit_on_sigterm():
            try:
                _sigterm_self()
            finally:
                raise RuntimeError("session closed mid-commit")
    assert e.value.code == 143
    assert isinstance(e.value.__cause__, RuntimeError)
    assert "stopping after SIGTERM, the unwinding raised RuntimeError: session closed mid-commit" in capsys.readouterr().err


def test_without_sigterm_errors_pass_through_unchanged():
    with pytest.raises(ValueError, match="bad input"):
        with exit_on_sigterm():
            raise ValueError("bad input")
