"""Warm-up phases: calls made inside vLLM's memory-profiling run, its warm-up compiles
and its CUDA-graph capture are recorded apart from real traffic.

The phase is process-wide (a recorder may be made, its first graph compiled, inside a
phase): a stack of names, read where a call's row is chosen (``GraphRecord.row_in``).
Nothing is switched on entry or exit: the hot path's one question is whether the stack is
empty (``IN_PROGRESS``, one list never rebound), and only a call made while it is not
looks its phase up.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# the phase of real traffic; any other (vLLM's "profile" run, its "warmup" compiles, its
# CUDA-graph "capture") is recorded apart, in rows of its own (``GraphRecord.warmup``)
SERVING = "serve"


# the warm-up phases entered and not left, innermost last: process-wide, as the recorder
# may be made (its first graph compiled) inside one. One list, changed in place, never
# rebound: a call's and a CUDA-graph replay's fast path read whether it is empty
IN_PROGRESS: list[str] = []


_PHASE_LOCK = threading.Lock()


def phase() -> str:
    """The phase calls are recorded in now: ``SERVING``, or the innermost warm-up's. Read in
    one step (a slice, one C call: another thread may leave the last phase meanwhile), and
    never by an exception, which would cost each serving call a raise."""
    innermost = IN_PROGRESS[-1:]
    return innermost[0] if innermost else SERVING


def rows_of(phase: str, serving: dict[Any, Any], warmups: dict[str, dict[Any, Any]]
            ) -> dict[Any, Any]:
    """The rows ``phase``'s calls go to: ``serving`` for real traffic, else the warm-up's
    own in ``warmups`` (made at its first use)."""
    return serving if phase == SERVING else warmups.setdefault(phase, {})


@contextmanager
def warmup(name: str) -> Iterator[None]:
    """Calls inside are ``name``'s (vLLM's "profile" run, its "warmup" compiles, its
    CUDA-graph "capture": not traffic), recorded apart from real traffic's rows: the
    report has them under ``warmup``, the tables and the counters leave them out. Nests:
    the innermost phase counts; past the outermost, calls are traffic again."""
    with _PHASE_LOCK:
        IN_PROGRESS.append(name)
    try:
        yield
    finally:
        with _PHASE_LOCK:
            if name in IN_PROGRESS:
                del IN_PROGRESS[len(IN_PROGRESS) - 1 - IN_PROGRESS[::-1].index(name)]
