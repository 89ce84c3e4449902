"""CUDA-event timing without synchronisation, CUDA-graph replays included.

A call is *counted* when it is made and *timed* when its events are read: the count never
waits for the device, and only the sample arrives later (``SizeStats.add_call`` /
``add_late`` / ``add_lost``).

Eager calls: a start/end ``torch.cuda.Event(enable_timing=True)`` pair from a pool is
recorded on the current stream around the call; pairs are read later with ``query()``
(never ``synchronize()`` on the calling thread), oldest first, each time a new call starts
and at every flush of the report. At most ``max_in_flight`` pairs wait; past that the
oldest pair's sample is given up (the call stays counted; its row's ``lost`` says so).
``harvest_all(wait=True)`` (the recorder's flush, on its own thread, and at exit) takes
the pairs still in flight and waits for them, so that after N calls and a flush the
report says N calls and N samples.

Stream capture (CUDA graphs): a call made while its stream is capturing records a pair
created with ``external=True``; the pair becomes part of the graph and is recorded again on
every replay. ``CUDAGraph.replay`` is wrapped: each replay counts a call of every row
captured in it, and, before the graph replays again (or at a flush), the pairs of its
previous replay are read and credited to their rows (a pair still running then is lost:
the replay overwrites it).
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any


def _torch_cuda() -> Any:
    import torch

    return torch.cuda


# every timer made in this process, so that a flush can read them all
_TIMERS: weakref.WeakSet[CudaEventTimer] = weakref.WeakSet()


class CudaEventTimer:
    def __init__(self, max_in_flight: int = 256, cuda: Any = None) -> None:
        self.cuda = cuda or _torch_cuda()
        self.max_in_flight = max_in_flight
        self.pending: deque[tuple[Any, Any, Any]] = deque()
        self.pool: list[tuple[Any, Any]] = []
        self.dropped = 0
        # the calling thread appends, a flush thread may take: one short lock, never held
        # while anything waits for the device
        self._lock = threading.Lock()
        # patched now, before any capture begins, so captures know their graph
        self.capture = capture_registry(self.cuda)
        _TIMERS.add(self)

    # --- eager calls ------------------------------------------------------------------

    def time_call(self, fn: Callable[..., Any], args: Sequence[Any], row: Any) -> Any:
        if self.cuda.is_current_stream_capturing():
            return self.capture.time_captured(fn, args, row)
        token = self.start(row)
        out = fn(*args)
        self.stop(token)
        return out

    def start(self, row: Any) -> tuple[Any, Any, Any]:
        """Record a start event for a call of ``row`` (not under stream capture: use
        ``time_call`` there); ``stop`` the token after the call."""
        with self._lock:
            self._harvest_finished()
            start, end = self.pool.pop() if self.pool else self._new_pair()
        start.record()
        return start, end, row

    def stop(self, token: tuple[Any, Any, Any]) -> None:
        """Record the end event; the call is counted now, timed when the pair is read."""
        start, end, row = token
        end.record()
        row.add_call()
        with self._lock:
            if len(self.pending) >= self.max_in_flight:
                *_, old_row = self.pending.popleft()
                old_row.add_lost()
                self.dropped += 1
            self.pending.append((start, end, row))

    def _harvest_finished(self) -> int:
        """(Under the lock.) Credit the finished pairs, oldest first."""
        done = 0
        pending = self.pending
        while pending and pending[0][1].query():
            start, end, row = pending.popleft()
            row.add_late(int(start.elapsed_time(end) * 1e6))
            self.pool.append((start, end))
            done += 1
        return done

    def _new_pair(self) -> tuple[Any, Any]:
        return (self.cuda.Event(enable_timing=True), self.cuda.Event(enable_timing=True))

    def harvest(self, wait: bool = False) -> int:
        """Credit finished pairs, oldest first; stop at the first unfinished one, or with
        ``wait`` wait for every pair in flight (outside the lock: the calling thread goes on
        making calls meanwhile). Returns the samples credited."""
        if not wait:
            with self._lock:
                return self._harvest_finished()
        with self._lock:
            taken = list(self.pending)
            self.pending.clear()
        done = 0
        for start, end, row in taken:
            end.synchronize()
            row.add_late(int(start.elapsed_time(end) * 1e6))
            done += 1
        with self._lock:
            self.pool.extend((start, end) for start, end, _ in taken)
        return done


class CaptureRegistry:
    """Pairs recorded inside CUDA-graph captures, by graph: each replay counts a call of
    their rows; their times are read before the next replay or at a flush."""

    def __init__(self, cuda: Any) -> None:
        self.cuda = cuda
        self.by_graph: weakref.WeakKeyDictionary[Any, list[tuple[Any, Any, Any]]] = \
            weakref.WeakKeyDictionary()
        self.replayed: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        self.current = threading.local()
        self.missed = 0
        self._lock = threading.Lock()
        _REGISTRIES[cuda.CUDAGraph] = self  # the newest registry of a class is its current one
        self._patch()

    def _patch(self) -> None:
        """Wrap the graph class once; the wrappers find the class's current registry."""
        from fxflops.patching import patch_method

        graph_cls = self.cuda.CUDAGraph

        def wrap_begin(begin: Any) -> Any:
            def capture_begin(graph: Any, *args: Any, **kwargs: Any) -> Any:
                _REGISTRIES[graph_cls].current.graph = graph
                return begin(graph, *args, **kwargs)

            return capture_begin

        def wrap_replay(replay: Any) -> Any:
            def patched_replay(graph: Any, *args: Any, **kwargs: Any) -> Any:
                registry = _REGISTRIES[graph_cls]
                registry.read(graph, lose_unfinished=True)
                out = replay(graph, *args, **kwargs)
                registry.replayed_now(graph)
                return out

            return patched_replay

        patch_method(graph_cls, "capture_begin", "capture", wrap_begin)
        patch_method(graph_cls, "replay", "capture", wrap_replay)

    def time_captured(self, fn: Callable[..., Any], args: Sequence[Any], row: Any) -> Any:
        """A call made while the stream captures: nothing runs now (no call is counted);
        the pair recorded here runs, and is counted, at each replay."""
        start = self.cuda.Event(enable_timing=True, external=True)
        end = self.cuda.Event(enable_timing=True, external=True)
        start.record()
        out = fn(*args)
        end.record()
        graph = getattr(self.current, "graph", None)
        if graph is not None:
            with self._lock:
                self.by_graph.setdefault(graph, []).append((start, end, row))
        return out

    def replayed_now(self, graph: Any) -> None:
        with self._lock:
            pairs = self.by_graph.get(graph)
            if not pairs:
                return
            for _, _, row in pairs:
                row.add_call()
            self.replayed[graph] = True

    def read(self, graph: Any, lose_unfinished: bool = False, wait: bool = False) -> None:
        """The last replay's times of ``graph``'s pairs, once. A pair not finished yet is
        left for a later read, or lost with ``lose_unfinished`` (the replay about to start
        records it again); ``wait``: wait for it (at exit, when nothing replays any more)."""
        with self._lock:
            if not self.replayed.get(graph):
                return
            pairs = self.by_graph.get(graph, ())
            if not wait and not lose_unfinished and not all(e.query() for _, e, _ in pairs):
                return  # still running: read it next time
            self.replayed[graph] = False
        for start, end, row in pairs:
            if wait:
                end.synchronize()
            if wait or end.query():
                row.add_late(int(start.elapsed_time(end) * 1e6))
            else:
                row.add_lost()
                self.missed += 1

    def flush(self, wait: bool = False) -> None:
        """Read every graph's last replay (at report time)."""
        for graph in list(self.by_graph.keys()):
            self.read(graph, wait=wait)


# by CUDA-graph class: torch.cuda.CUDAGraph (tests use a fake one)
_REGISTRIES: dict[Any, CaptureRegistry] = {}


def capture_registry(cuda: Any = None) -> CaptureRegistry:
    cuda = cuda or _torch_cuda()
    registry = _REGISTRIES.get(cuda.CUDAGraph)
    if registry is None:
        registry = CaptureRegistry(cuda)  # registers itself
    return registry


def harvest_all(wait: bool = False) -> int:
    """Read every timer's finished pairs and every captured graph's last replay; with
    ``wait``, wait for eager pairs still in flight (the flush thread's and exit's way: the
    host's threads are never made to wait). Returns the eager samples credited."""
    done = 0
    for timer in list(_TIMERS):
        done += timer.harvest(wait=wait)
    for registry in list(_REGISTRIES.values()):
        registry.flush(wait=False)
    return done


def finish_all() -> None:
    """At exit, when nothing calls or replays any more: wait for everything still out."""
    harvest_all(wait=True)
    for registry in list(_REGISTRIES.values()):
        registry.flush(wait=True)
