"""What a serving engine says of its own steps, kept beside the measured rows: its analytic
estimate of each step's FLOPs and bytes (an engine's own MFU metrics), and its speculative
decoding's drafts and acceptances. Data only: an integration adds to it once per step
(never per graph call), the report reads it.

An estimate's FLOPs are kept twice: by the engine's own breakdown keys, as the engine
named them (the report keeps them as they are), and by fxflops' :data:`COMPONENTS`, into
which the integration that knows the engine's keys sorts them as it records the step: what
the report sets beside the measured FLOPs.
"""

from __future__ import annotations

import threading

# what fxflops can tell apart of a step's matmul FLOPs in the graphs that ran, and an
# estimate's FLOPs are sorted into: the two attention products over (query, key) pairs;
# a mixture of experts' routed experts; the rest (projections, dense and shared FFNs);
# the share spent on padded tokens (measured only: an estimate counts the scheduled
# ones); the LM head (which runs outside the compiled graphs)
COMPONENTS = ("attention", "moe", "rest", "padding", "lm_head")


class EstimateRow:
    """An engine's own estimate of the steps of one forward size (the forward row's: padded
    where the engine pads): steps, tokens scheduled, FLOPs, bytes read and written, FLOPs
    by the engine's own breakdown keys (``by_key``) and by fxflops' :data:`COMPONENTS`
    (``by_component``)."""

    __slots__ = ("by_component", "by_key", "flops", "read_bytes", "scheduled_tokens", "size",
                 "steps", "write_bytes")

    def __init__(self, size: int) -> None:
        self.size = size
        self.steps = 0
        self.scheduled_tokens = 0
        self.flops = 0
        self.read_bytes = 0
        self.write_bytes = 0
        self.by_key: dict[str, int] = {}
        self.by_component: dict[str, int] = {}

    def add(self, scheduled_tokens: int, flops: int, read_bytes: int, write_bytes: int,
            by_key: dict[str, int], by_component: dict[str, int]) -> None:
        """One step: ``by_key`` as the engine broke its FLOPs down, ``by_component`` the
        same FLOPs in fxflops' components (a name that is none of them counts as
        ``"rest"``)."""
        self.steps += 1
        self.scheduled_tokens += scheduled_tokens
        self.flops += flops
        self.read_bytes += read_bytes
        self.write_bytes += write_bytes
        for name, value in by_key.items():
            self.by_key[name] = self.by_key.get(name, 0) + value
        for name, value in by_component.items():
            name = name if name in COMPONENTS else "rest"
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
        # per component, why the engine's estimate may differ from the measured FLOPs (its
        # own counting conventions), as the integration that records the estimate says it;
        # the report has a plain reason for any component it leaves out
        self.why: dict[str, str] = {}
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
