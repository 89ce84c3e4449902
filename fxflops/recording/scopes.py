"""Scopes: the calls made while a scope is open, in rows of its own, and merged into the
rows around it.

Opening a scope (``Recorder.open_scope``) points every graph's calls at the scope's rows,
as a warm-up phase does (``GraphRecord.enter_scope``: O(graphs) at the switch, nothing per
call); a graph compiled while it is open starts there. A scope's rows are fresh: a size's
first calls are each timed again, so a scope of a few calls has its own median. Its rows
are kept per phase (a warm-up inside a scope stays warm-up).

Nothing is lost to the rows around it: each scope row is merged into the enclosing
scope's row, or the process-wide row, of its graph, phase and size (``SizeStats.merge_from``:
calls, sums, samples, run-time counts, all exact), what it recorded since the last merge
each time: when the scope closes, and before any reader reads the rows (a report's flush,
a scrape: ``Recorder.settle``). Scopes nest: an inner one merges into the outer one's rows.

Scopes are the process's, not a thread's: a call any thread makes while one is open is
the scope's. CUDA-graph replays are counted in the process-wide rows only (a replay's
calls go to the rows of the phase it is replayed in: ``cuda_events``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from fxflops.recording.size_stats import SizeStats
from fxflops.recording.store import BackwardPasses, GraphRecord


class RecordingScope:
    """One open (or closed) scope: its rows of each graph, by phase and size key, and how
    much of each row has been merged into the rows around it."""

    def __init__(self, parent: RecordingScope | None, passes: BackwardPasses) -> None:
        self.parent = parent  # the scope it was opened in (None: the process-wide rows)
        self.rows: dict[GraphRecord, dict[str, dict[Any, SizeStats]]] = {}
        # id(row) -> (row, its mark when last merged): what each row has handed on
        self._marks: dict[int, tuple[SizeStats, tuple[int, ...]]] = {}
        self._sync_lock = threading.Lock()  # one merge of this scope at a time
        self.closed = False
        self.started = time.time()
        # the process's backward passes per size, at the start and (closed) at the end
        self._passes = passes
        self._passes_at = dict(passes.by_size)
        self._passes_end: dict[Any, int] | None = None

    def rows_of(self, record: GraphRecord) -> dict[str, dict[Any, SizeStats]]:
        """This scope's rows of ``record``, by phase (made empty at first)."""
        rows = self.rows.get(record)
        if rows is None:
            rows = self.rows.setdefault(record, {})
        return rows

    def close(self) -> None:
        self.closed = True
        self._passes_end = dict(self._passes.by_size)

    def backward_passes(self) -> dict[Any, int]:
        """The backward passes run while the scope was open, per size."""
        end = self._passes_end if self._passes_end is not None else dict(self._passes.by_size)
        return {size: n - self._passes_at.get(size, 0) for size, n in end.items()
                if n > self._passes_at.get(size, 0)}

    def sync(self, blocking: bool = True) -> None:
        """Merge what each row recorded since its last merge into the enclosing scope's
        row, or the process-wide row, of its graph, phase and size. Not ``blocking`` (a
        signal handler): rows whose locks are out of reach wait for the next merge."""
        if not self._sync_lock.acquire(blocking=blocking):
            return
        try:
            parent = self.parent
            for record, by_phase in list(self.rows.items()):
                for phase, rows in list(by_phase.items()):
                    target = parent.rows_of(record).setdefault(phase, {}) \
                        if parent is not None else record.phase_rows(phase)
                    for raw_key, row in list(rows.items()):
                        held = self._marks.get(id(row))
                        since = held[1] if held is not None else None
                        if since is not None and since == row.mark():
                            continue  # nothing new
                        dest = record.adopt(target, raw_key, row, blocking)
                        if dest is None or dest is row:
                            continue
                        self._marks[id(row)] = (row, dest.merge_from(row, since))
        finally:
            self._sync_lock.release()

    def clear(self) -> None:
        """Forget the scope's rows (the recorder's were reset)."""
        with self._sync_lock:
            for by_phase in list(self.rows.values()):
                for rows in list(by_phase.values()):
                    rows.clear()
            self._marks.clear()
            self._passes_at = dict(self._passes.by_size)

    def after_fork(self) -> None:
        """(In a forked child.) A lock of its own (the parent's may have been held at the
        fork), and empty rows: the parent's calls are the parent's."""
        self._sync_lock = threading.Lock()
        self.clear()

    def calls(self) -> int:
        """Calls recorded in the scope (every graph, size and phase)."""
        return sum(r.count for by_phase in list(self.rows.values())
                   for rows in list(by_phase.values()) for r in list(rows.values()))

    def graphs_run(self) -> list[GraphRecord]:
        """The graphs that ran while the scope was open, each holding the scope's rows
        only (``GraphRecord.with_rows``), in registration order: what a report of the
        scope is built from (``Recorder.scope_view``)."""
        return [record.with_rows(by_phase)
                for record, by_phase in sorted(list(self.rows.items()), key=lambda item: item[0].id)
                if any(r.count for rows in list(by_phase.values()) for r in list(rows.values()))]
