"""The process around the recorder: its exit, its signals, its forks.

- exit: the process's recorder flushes one last time (``final``: CUDA-graph replays
  counted, samples in flight waited for);
- fork: a child starts with empty counts, its own started-file and its own flush thread
  (each sink's ``after_fork``); a multiprocessing child (which ends with ``os._exit``)
  writes its report at its exit, from multiprocessing's own exit hook.

Installed at first use (``outputs.session.attach``, a sink's first registration), never at
import, each once per process.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

from fxflops.outputs import signals
from fxflops.recording.recorder import current


def flush_current() -> None:
    """The process's recorder's last flush (at exit)."""
    rec = current()
    if rec is not None:
        rec.flush(final=True)


def _at_multiprocessing_exit(mp_util: Any) -> None:
    """A multiprocessing child started by fork ends with ``os._exit`` (no atexit): its
    report is written by multiprocessing's exit hook (which runs its finalizers)."""
    mp_util.Finalize(None, flush_current, exitpriority=100)


_EXIT_HOOK: list[bool] = []


def install_exit_hooks() -> None:
    """The report at exit, and at SIGTERM/SIGINT (``signals``)."""
    if not _EXIT_HOOK:
        _EXIT_HOOK.append(True)
        atexit.register(flush_current)
    signals.hook_signals()


def _after_fork_in_child() -> None:
    signals.after_fork_in_child()
    rec = current()
    if rec is None:
        return
    rec.after_fork()
    # a multiprocessing child clears the finalizers it inherited, then runs its after-fork
    # callbacks: the exit hook is registered there
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        mp_util.register_after_fork(rec, lambda _: _at_multiprocessing_exit(mp_util))


_FORK_HOOK: list[bool] = []


def install_fork_hook() -> None:
    """A forked child's recorder starts over (once per process)."""
    if not _FORK_HOOK:
        _FORK_HOOK.append(True)
        os.register_at_fork(after_in_child=_after_fork_in_child)
