"""Scopes: what the rows recorded while a scope was open, as differences of marks.

A row only ever adds to its counters. Opening a scope (``Recorder.open_scope``) takes a
mark of every row (``size_stats.mark``: O(rows), never a cost on the hot path); closing it
takes another; what the scope saw is each row's difference between the two
(``size_stats.since``), and, while it is open, between its opening mark and now. Rows made
while it was open count from their first call; rows made after it closed are not its.
Nothing is added to a call's path, nothing is merged back: the process-wide rows are the
only rows, so a scope sees every call they see, CUDA-graph replays included (the replays
counted at a collection are collected before each mark).

A CUDA-event sample comes after its call, in the order calls were chosen: a mark's
sample fields are read once the calls chosen by then have had their samples
(``RowMark.ripe``), so a call's sample is the scope's exactly when the call is, late or
not. Opening a scope times each row's next calls again (``SizeStats.retime``), as a new
size's first ones: a scope of a few calls has its own median. Scopes nest and may close in
any order (each is its own pair of marks); they are the process's, not a thread's: a call
any thread makes while one is open is the scope's.
"""

from __future__ import annotations

import time
from typing import Any

from fxflops.recording.size_stats import RowMark, SizeStats, mark, since
from fxflops.recording.store import BackwardPasses, GraphRecord


class RecordingScope:
    """One open (or closed) scope: a mark of every row when it opened, and of every row
    when it closed."""

    def __init__(self, records: list[GraphRecord], passes: BackwardPasses) -> None:
        self.started = time.time()
        self._start = _marks(records)
        self._end: dict[SizeStats, RowMark] | None = None
        for record in records:  # (after the marks: a retimed call is the scope's)
            for _, _, row in record.every_row():
                row.retime()
        # the process's backward passes per size, at the start and (closed) at the end
        self._passes = passes
        self._passes_at = dict(passes.by_size)
        self._passes_end: dict[Any, int] | None = None

    @property
    def closed(self) -> bool:
        return self._end is not None

    def close(self, records: list[GraphRecord]) -> None:
        self._end = _marks(records)
        self._passes_end = dict(self._passes.by_size)

    def backward_passes(self) -> dict[Any, int]:
        """The backward passes run while the scope was open, per size."""
        end = self._passes_end if self._passes_end is not None else dict(self._passes.by_size)
        return {size: n - self._passes_at.get(size, 0) for size, n in end.items()
                if n > self._passes_at.get(size, 0)}

    def clear(self) -> None:
        """Start again from the rows as they are (the recorder's were reset, or a forked
        child's are empty)."""
        self._start = {}
        self._passes_at = dict(self._passes.by_size)

    def rows_of(self, record: GraphRecord) -> dict[str, dict[Any, SizeStats]]:
        """What ``record``'s rows recorded in the scope, by phase and size key (detached
        rows; a row with no call in it left out)."""
        out: dict[str, dict[Any, SizeStats]] = {}
        for phase, key, row in record.every_row():
            if self._end is not None and row not in self._end:
                continue  # made after the scope closed
            end = self._end.get(row) if self._end is not None else None
            seen = since(row, self._start.get(row), end)
            if seen.count or seen.samples_taken:
                out.setdefault(phase, {})[key] = seen
        return out

    def graphs_run(self, records: list[GraphRecord]) -> list[GraphRecord]:
        """The graphs that ran while the scope was open, each holding what the scope saw
        (``GraphRecord.with_rows``), in registration order: what a report of the scope is
        built from (``report.scope.scope_view``)."""
        out = []
        for record in records:
            rows = self.rows_of(record)
            if any(rows.values()):
                out.append(record.with_rows(rows))
        return out


def _marks(records: list[GraphRecord]) -> dict[SizeStats, RowMark]:
    return {row: mark(row) for record in records for _, _, row in record.every_row()}

