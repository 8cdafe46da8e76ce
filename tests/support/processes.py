"""Stopping a child process the one way the tests, e2e and benchmarks do: SIGTERM, a grace period, SIGKILL."""

from __future__ import annotations

import signal
import subprocess

#: stop()'s answer when the process had to be killed
KILLED = None


def stop(proc: subprocess.Popen[bytes] | subprocess.Popen[str], grace: float = 30) -> int | None:
    """SIGTERM (unless it already exited), up to ``grace`` seconds for it to exit, then SIGKILL.

    Returns its exit code, or None (``KILLED``) when it ignored SIGTERM for the grace period and was killed.
    """
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        return KILLED
