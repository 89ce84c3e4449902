"""Subprocesses for the tests: every one with a timeout and the default SIGINT and SIGTERM
handlers, whatever the shell that started pytest ignores (a shell's background job
inherits SIG_IGN for SIGINT, and so would its children: a test that interrupts one would
hang)."""

from __future__ import annotations

import signal
import subprocess
from typing import Any

# a vLLM run takes about a minute on 2 cores; nothing a test starts may take longer than this
TIMEOUT = 900


def default_signals() -> None:
    """(In the child, before exec.) The default SIGINT and SIGTERM handlers."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def run(cmd: list[str], timeout: float = TIMEOUT, **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run`` with a timeout and default signal handlers (text output)."""
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    return subprocess.run(cmd, timeout=timeout, preexec_fn=default_signals, **kwargs)


def popen(cmd: list[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen`` with default signal handlers; finish it with ``finish``."""
    kwargs.setdefault("text", True)
    return subprocess.Popen(cmd, preexec_fn=default_signals, **kwargs)


def finish(proc: subprocess.Popen, timeout: float = TIMEOUT) -> tuple[str, str]:
    """(stdout, stderr) of a process started by ``popen``; killed if it outlives
    ``timeout``."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=60)
        raise AssertionError(
            f"{proc.args!r} ran past {timeout} s:\n{(err or '')[-3000:]}") from None
    return out or "", err or ""
