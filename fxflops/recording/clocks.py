"""The clocks a call is timed on: one protocol, two implementations.

A clock times one call of a row: ``time_call(fn, args, row)`` runs it, counts it in the row
and gives the row its sample, now (the CPU clock) or when the device has run it (CUDA
events, ``recording/cuda_events.py``). Where the call is not one function call (a vLLM
forward timed around the runner's own code), ``start(row)`` and ``stop(token)`` bracket it;
a token knows its ``row``.

Which calls are timed is the caller's business: an instrumented graph on the CPU clock
samples a size's calls (``SizeStats.due``), and times those it samples here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from fxflops.recording.size_stats import SizeStats

now = time.perf_counter_ns


class Token(Protocol):
    """What ``start`` hands back for ``stop``: it knows the row it times."""

    @property
    def row(self) -> SizeStats: ...


class Clock(Protocol):
    def time_call(self, fn: Callable[..., Any], args: Sequence[Any], row: SizeStats,
                  record: Any = None, key: Any = None) -> Any:
        """``fn(*args)``, counted in ``row`` and timed. ``record`` and ``key``: the graph
        and size the call is of, for a clock that may see it again without being called
        (a CUDA graph's replays). Where ``captures_here()``, ``row`` is not read (a
        captured call is counted at its replays, in the rows of their phase)."""
        ...

    def start(self, row: SizeStats) -> Token | None:
        """A call of ``row`` begins; None where there is nothing to time or count (a CUDA
        stream capturing: a capture runs nothing), which callers treat as a call that
        counts nothing."""
        ...

    def stop(self, token: Any) -> None:
        """(``token``: what this clock's ``start`` gave.)"""
        ...

    def is_capturing(self) -> bool:
        """A CUDA-graph capture in progress (then nothing may wait for the device)."""
        ...

    def captures_here(self) -> bool:
        """This thread's stream captures a CUDA graph: a call made now is the capture's
        (``time_call`` hands it to the graph, counted at its replays)."""
        ...


class CpuToken(NamedTuple):
    t0: int
    row: SizeStats


class CpuClock:
    """The host's monotonic clock: the call's wall time, counted and sampled as it
    returns (a call that raises is neither)."""

    __slots__ = ()

    def time_call(self, fn: Callable[..., Any], args: Sequence[Any], row: SizeStats,
                  record: Any = None, key: Any = None) -> Any:
        t0 = now()
        out = fn(*args)
        row.add(now() - t0)
        return out

    def start(self, row: SizeStats) -> CpuToken:
        return CpuToken(now(), row)

    def stop(self, token: CpuToken) -> None:
        token.row.add(now() - token.t0)

    def is_capturing(self) -> bool:
        return False

    def captures_here(self) -> bool:
        return False


CPU_CLOCK = CpuClock()


def clock_for(device: str) -> Clock:
    """The clock for calls on ``device``: CUDA events on a GPU (made at first use: CUDA is
    imported only then), else the CPU's."""
    if device != "cuda":
        return CPU_CLOCK
    from fxflops.recording.cuda_events import CudaEventClock

    return CudaEventClock()
