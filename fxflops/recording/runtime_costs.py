"""Run-time costs: FLOPs and bytes known only when a call is made (vLLM attention: its
(query, key) pairs and KV-cache tokens), charged to the call's row from late-bound
costers that an integration wires.
"""

from __future__ import annotations

from collections.abc import Callable

from fxflops.recording.size_stats import SizeStats


def _no_counts(window: int | None) -> None:
    return None


def _no_window(layer: str | None) -> None:
    return None


def _no_bytes(layer: str | None) -> None:
    return None


class RuntimeCoster:
    """A late-bound source of run-time counts of one kind. For "attention": ``counts(window)``
    gives the current call's (query, key) pairs and KV-cache context tokens with that
    sliding window (None: none), ``window_of(layer)`` a layer's window, and
    ``bytes_of(layer)`` the bytes a context token takes in the layer's cache where the
    integration knows better than the graph (a quantised cache: the graph's K and V are in
    the model's dtype; None: the graph's count stands). Graphs hold the object; an
    integration sets them whenever it loads, before or after the graphs were compiled or
    deserialised."""

    __slots__ = ("bytes_of", "counts", "window_of")

    def __init__(self) -> None:
        self.counts: Callable[[int | None], tuple[int, int] | None] = _no_counts
        self.window_of: Callable[[str | None], int | None] = _no_window
        self.bytes_of: Callable[[str | None], int | None] = _no_bytes


# by kind; process-wide (not the recorder's): an integration wires them once, and graphs
# and recorders made later, a reset one included, find them wired
COSTERS: dict[str, RuntimeCoster] = {}


def coster(kind: str) -> RuntimeCoster:
    """The run-time coster of ``kind``, made unwired (counting nothing) on first use."""
    found = COSTERS.get(kind)
    if found is None:
        found = COSTERS.setdefault(kind, RuntimeCoster())
    return found


def charge_runtime(row: SizeStats, costers: dict[str, RuntimeCoster] = COSTERS) -> None:
    """Add the current call's run-time FLOPs and bytes to ``row``: per group of layers that
    share a window, its FLOPs per pair times the call's pairs, and its bytes per context
    token (its cache's, where the coster knows them) times the call's context tokens. The
    groups are made at the row's first call. A row with no run-time terms (``row.runtime``
    None) is charged nothing."""
    counts = row.runtime
    if counts is None:
        return
    groups = counts.groups
    if groups is None:
        merged: dict[tuple[str, int | None], list[int]] = {}
        for kind, layer, flops, bytes_ in counts.terms:
            key = (kind, costers[kind].window_of(layer))
            cache_bytes = costers[kind].bytes_of(layer)
            acc = merged.setdefault(key, [0, 0])
            acc[0] += flops
            acc[1] += bytes_ if cache_bytes is None else cache_bytes
        groups = counts.groups = [(costers[k], w, f, b, k)
                                       for (k, w), (f, b) in merged.items()]
    charged = [(flops * got[0], bytes_ * got[1], kind) for coster, window, flops, bytes_, kind
               in groups if (got := coster.counts(window)) is not None]
    if not charged:
        return
    with row.lock:  # (calls from several threads at one size: each charged)
        by_kind = counts.by_kind
        for flops, bytes_, kind in charged:
            counts.flops += flops
            counts.bytes += bytes_
            if by_kind is not None:
                by_kind[kind] = by_kind.get(kind, 0) + flops
        counts.calls += 1


