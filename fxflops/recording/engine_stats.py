"""What a serving engine says of its own steps, kept beside the measured rows: its analytic
estimate of each step's FLOPs and bytes (vLLM's ``--enable-mfu-metrics``), and its
speculative decoding's drafts and acceptances. Data only: an integration adds to it once
per step (never per graph call), the report reads it.
"""

from __future__ import annotations

import threading


class EstimateRow:
    """An engine's own estimate of the steps of one forward size (the forward row's: padded
    where the engine pads): steps, tokens scheduled, FLOPs, bytes read and written, and
    FLOPs by the engine's components (its names)."""

    __slots__ = ("by_component", "flops", "read_bytes", "scheduled_tokens", "size", "steps",
                 "write_bytes")

    def __init__(self, size: int) -> None:
        self.size = size
        self.steps = 0
        self.scheduled_tokens = 0
        self.flops = 0
        self.read_bytes = 0
        self.write_bytes = 0
        self.by_component: dict[str, int] = {}

    def add(self, scheduled_tokens: int, flops: int, read_bytes: int, write_bytes: int,
            by_component: dict[str, int]) -> None:
        self.steps += 1
        self.scheduled_tokens += scheduled_tokens
        self.flops += flops
        self.read_bytes += read_bytes
        self.write_bytes += write_bytes
        for name, value in by_component.items():
            self.by_component[name] = self.by_component.get(name, 0) + value


class SpecDecodeCounts:
    """Speculative decoding as the engine scored it: requests' steps that carried drafts,
    draft tokens proposed, and of those accepted (the rest were computed by the target and
    thrown away)."""

    __slots__ = ("accepted", "drafts", "proposed")

    def __init__(self) -> None:
        self.drafts = 0
        self.proposed = 0
        self.accepted = 0

    def add(self, proposed: int, accepted: int) -> None:
        self.drafts += 1
        self.proposed += proposed
        self.accepted += min(accepted, proposed)

    @property
    def rejected(self) -> int:
        return self.proposed - self.accepted


class EngineStats:
    """The process's engine-side figures (``Recorder.engine``)."""

    def __init__(self) -> None:
        self.estimates: dict[int, EstimateRow] = {}
        self.spec_decode = SpecDecodeCounts()
        self._lock = threading.Lock()

    def estimate(self, size: int) -> EstimateRow:
        row = self.estimates.get(size)
        if row is None:
            with self._lock:
                row = self.estimates.setdefault(size, EstimateRow(size))
        return row

    def estimates_snapshot(self) -> list[EstimateRow]:
        return sorted(list(self.estimates.values()), key=lambda r: r.size)

    def clear(self) -> None:
        self.estimates.clear()
        self.spec_decode = SpecDecodeCounts()
        self._lock = threading.Lock()
