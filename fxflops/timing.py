"""CUDA-event timing without synchronisation, CUDA-graph replays included.

Eager calls: a start/end ``torch.cuda.Event(enable_timing=True)`` pair from a pool is
recorded on the current stream around the call; pairs are harvested later with ``query()``
(never ``synchronize()``), oldest first, each time a new call starts. At most
``max_in_flight`` pairs wait; past that the oldest sample is dropped (counted), not waited
for.

Stream capture (CUDA graphs): a call made while its stream is capturing records a pair
created with ``external=True``; the pair becomes part of the graph and is recorded again on
every replay. ``CUDAGraph.replay`` is wrapped so that, before a graph replays, the pairs of
its previous replay are read (they would be overwritten) and credited to their row.
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


class CudaEventTimer:
    def __init__(self, max_in_flight: int = 256, cuda: Any = None) -> None:
        self.cuda = cuda or _torch_cuda()
        self.max_in_flight = max_in_flight
        self.pending: deque[tuple[Any, Any, Any]] = deque()
        self.pool: list[tuple[Any, Any]] = []
        self.dropped = 0
        # patched now, before any capture begins, so captures know their graph
        self.capture = capture_registry(self.cuda)

    # --- eager calls ------------------------------------------------------------------

    def time_call(self, fn: Callable[..., Any], args: Sequence[Any], row: Any) -> Any:
        if self.cuda.is_current_stream_capturing():
            return self.capture.time_captured(fn, args, row)
        self.harvest()
        start, end = self.pool.pop() if self.pool else self._new_pair()
        start.record()
        out = fn(*args)
        end.record()
        if len(self.pending) >= self.max_in_flight:
            self.pending.popleft()
            self.dropped += 1
        self.pending.append((start, end, row))
        return out

    def _new_pair(self) -> tuple[Any, Any]:
        return (self.cuda.Event(enable_timing=True), self.cuda.Event(enable_timing=True))

    def harvest(self) -> int:
        """Credit every finished pair, oldest first; stop at the first unfinished one."""
        done = 0
        pending = self.pending
        while pending and pending[0][1].query():
            start, end, row = pending.popleft()
            row.add(int(start.elapsed_time(end) * 1e6))
            self.pool.append((start, end))
            done += 1
        return done


class CaptureRegistry:
    """Pairs recorded inside CUDA-graph captures, by graph, read before each replay."""

    def __init__(self, cuda: Any) -> None:
        self.cuda = cuda
        self.by_graph: weakref.WeakKeyDictionary[Any, list[tuple[Any, Any, Any]]] = \
            weakref.WeakKeyDictionary()
        self.replayed: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        self.current = threading.local()
        self.missed = 0
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
                registry.read(graph)
                out = replay(graph, *args, **kwargs)
                if graph in registry.by_graph:
                    registry.replayed[graph] = True
                return out

            return patched_replay

        patch_method(graph_cls, "capture_begin", "capture", wrap_begin)
        patch_method(graph_cls, "replay", "capture", wrap_replay)

    def time_captured(self, fn: Callable[..., Any], args: Sequence[Any], row: Any) -> Any:
        start = self.cuda.Event(enable_timing=True, external=True)
        end = self.cuda.Event(enable_timing=True, external=True)
        start.record()
        out = fn(*args)
        end.record()
        graph = getattr(self.current, "graph", None)
        if graph is not None:
            self.by_graph.setdefault(graph, []).append((start, end, row))
        return out

    def read(self, graph: Any) -> None:
        """The previous replay's times of ``graph``'s pairs, before this replay overwrites them."""
        if not self.replayed.get(graph):
            return
        self.replayed[graph] = False
        for start, end, row in self.by_graph.get(graph, ()):
            if end.query():
                row.add(int(start.elapsed_time(end) * 1e6))
            else:
                self.missed += 1

    def flush(self) -> None:
        """Read every graph's last replay (at report time)."""
        for graph in list(self.by_graph.keys()):
            self.read(graph)


# by CUDA-graph class: torch.cuda.CUDAGraph (tests use a fake one)
_REGISTRIES: dict[Any, CaptureRegistry] = {}


def capture_registry(cuda: Any = None) -> CaptureRegistry:
    cuda = cuda or _torch_cuda()
    registry = _REGISTRIES.get(cuda.CUDAGraph)
    if registry is None:
        registry = CaptureRegistry(cuda)  # registers itself
    return registry
