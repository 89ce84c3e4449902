"""Warm-up phases: calls made inside vLLM's memory-profiling run, its warm-up compiles
and its CUDA-graph capture are recorded apart from real traffic.

The phase stack is process-wide (a recorder may be made, its first graph compiled, inside
a phase); every recorder watching it is switched on entry and exit, never per call.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# the phase of real traffic; any other (vLLM's "profile" run, its "warmup" compiles, its
# CUDA-graph "capture") is recorded apart, in rows of its own (``Recorder.warmup``)
SERVING = "serve"


# the warm-up phases entered and not left, innermost last: process-wide, as the recorder
# may be made (its first graph compiled) inside one. One list, changed in place, never
# rebound: the CUDA-graph replay's fast path reads whether it is empty
IN_PROGRESS: list[str] = []


_PHASE_LOCK = threading.Lock()
# the recorders to switch (``Recorder.switch``) when the phase changes
_WATCHERS: weakref.WeakSet[Any] = weakref.WeakSet()


def watch(recorder: Any) -> str:
    """Switch ``recorder`` at every phase change from now on; returns the phase now."""
    with _PHASE_LOCK:
        _WATCHERS.add(recorder)
        return phase()


def phase() -> str:
    """The phase calls are recorded in now: ``SERVING``, or the innermost warm-up's."""
    phases = IN_PROGRESS
    return phases[-1] if phases else SERVING


@contextmanager
def warmup(name: str) -> Iterator[None]:
    """Calls inside are ``name``'s (vLLM's "profile" run, its "warmup" compiles, its
    CUDA-graph "capture": not traffic), recorded apart from real traffic's rows: the
    report has them under ``warmup``, the tables and the counters leave them out. Nests:
    the innermost phase counts; past the outermost, calls are traffic again. Switching is
    O(graphs) here, never a cost on the hot path (each graph's callable is pointed at the
    phase's rows)."""
    with _PHASE_LOCK:
        IN_PROGRESS.append(name)
        for rec in list(_WATCHERS):
            rec.switch(name)
    try:
        yield
    finally:
        with _PHASE_LOCK:
            if name in IN_PROGRESS:
                del IN_PROGRESS[len(IN_PROGRESS) - 1 - IN_PROGRESS[::-1].index(name)]
            for rec in list(_WATCHERS):
                rec.switch(phase())


