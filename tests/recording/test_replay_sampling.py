"""Sampled CUDA-graph replays (issue 48), on the CUDA simulator (tests/cuda_sim.py): vLLM's
piecewise serving, 60 pieces each captured in a graph of its own, replayed in turn for 640
steps with the device two steps behind the host (events read two steps late), as
tests/recording/test_timing.py drives replays.

What is checked: every replay counted, exactly, from threads too; no CUDA rule broken; a
row's first 16 replays timed, then one in FXFLOPS_REPLAY_SAMPLE_EVERY (N) on average, at
random strides: the replays chosen within 25% of 60 * (640 - 16) / N + 60 * 16, at most 5
CUDA event calls each, at least 90% of them timed and the rest lost (timed + lost =
chosen); no step times more than 12 pieces once their first 16 are done (a fixed stride
would time all 60 in one step: the control); a piece slow on every 32nd replay does not
move its median (a fixed stride of 32 would sample only the slow ones: the control); the
weighted total time within 5% of the true total; the same seed, the same replays chosen;
``FXFLOPS_REPLAY_SAMPLE_EVERY=1`` times every replay.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from fxflops import config
from fxflops.recording import cuda_events, phases
from fxflops.recording.size_stats import SizeStats
from tests.cuda_sim import CudaSim
from tests.helpers import RowsByPhase

PIECES, STEPS, EVERY, FIRST = 60, 640, 32, config.MIN_TIMED_FIRST


@pytest.fixture
def sim():
    """A simulated CUDA runtime with the device two host steps behind."""
    simulator = CudaSim(lag=2, devices=1)
    yield simulator
    cuda_events._CLOCKS.pop(simulator.CUDAGraph, None)



class Record(RowsByPhase):
    """A captured call's record, with its serving row at the size served."""

    @property
    def serving(self) -> SizeStats:
        return self.rows[(phases.SERVING, 8)]


@dataclass
class Served:
    """A piecewise model's graphs, and what serving them did."""

    graphs: list
    records: list[Record]
    ms: list[float]  # each piece's kernel
    chosen_per_step: list[int] = field(default_factory=list)
    true_ns: int = 0  # what the replays really took, all of them

    def rows(self) -> list[SizeStats]:
        return [r.serving for r in self.records]


def piecewise(sim: CudaSim, clock: cuda_events.CudaClock, pieces: int = PIECES) -> Served:
    """``pieces`` graphs, each captured (in vLLM's "capture" phase) around one call of a
    piece of its own at 8 tokens, its kernel 0.2 to 0.8 ms."""
    graphs, records, ms = [], [], []
    stream = sim.Stream()
    for i in range(pieces):
        record, g, t = Record(), sim.CUDAGraph(), 0.2 + 0.6 * i / pieces
        with phases.warmup("capture"), sim.graph(g, stream=stream):
            clock.time_call(lambda t=t: sim.launch(t), (), None, record, 8)
        graphs.append(g)
        records.append(record)
        ms.append(t)
    return Served(graphs, records, ms)


def kernel_ms(graph, ms: float) -> None:
    """(The simulator's captured kernel set to ``ms``: a piece whose time changes from one
    replay to the next, as a graph's does with what it reads.)"""
    graph._nodes[:] = [("kernel", ms) if kind == "kernel" else (kind, x)
                       for kind, x in graph._nodes]


def serve(sim: CudaSim, clock: cuda_events.CudaClock, served: Served, steps: int = STEPS,
          slow: Callable[[int], float | None] | None = None) -> None:
    """``steps`` steps, each replaying every piece in turn, the device two steps behind;
    ``slow(step)``: the first piece's time at that step (None: its own)."""
    for step in range(steps):
        before = clock.queue.queued  # (a chosen replay queues one pair)
        for i, g in enumerate(served.graphs):
            ms = served.ms[i]
            if i == 0 and slow is not None:
                ms = slow(step) or ms
                kernel_ms(g, ms)
            served.true_ns += round(ms * 1e6)
            g.replay()
        served.chosen_per_step.append(clock.queue.queued - before)
        sim.step()
    sim.drain()
    clock.collect(wait_s=1.0, final=True)


def event_calls(sim: CudaSim) -> int:
    return sum(n for (_, call), n in sim.calls.items() if call.startswith("Event."))


class FixedStride:
    """The clock's generator made to give one number: strides all N (``replay_chosen``
    draws N - N // 2 + int(random() * (2 * (N // 2) + 1)): 0.5 gives N), the stride the
    design rejects."""

    def random(self) -> float:
        return 0.5


@pytest.mark.parametrize("every", [EVERY, 16])
def test_every_replay_counted_a_sample_timed(sim, monkeypatch, every):
    """60 pieces, 640 steps: each row counts 640 replays exactly; the chosen ones are
    within 25% of what N promises, at most 5 CUDA event calls each (0.3 a replay at most),
    at least 90% of them timed, the rest lost; no CUDA rule broken."""
    monkeypatch.setenv("FXFLOPS_REPLAY_SAMPLE_EVERY", str(every))  # read at the capture
    clock = cuda_events.clock(sim)
    served = piecewise(sim, clock)
    calls_before = event_calls(sim)
    serve(sim, clock, served)
    rows = served.rows()
    assert [r.count for r in rows] == [STEPS] * PIECES
    assert clock.replays == PIECES * STEPS
    chosen = sum(r.chosen for r in rows)
    promised = PIECES * (STEPS - FIRST) / every + PIECES * FIRST
    assert 0.75 * promised <= chosen <= 1.25 * promised, (chosen, promised)
    calls = event_calls(sim) - calls_before
    assert calls <= 5 * chosen, (calls, chosen)
    if every == EVERY:
        assert calls / (PIECES * STEPS) <= 0.30, calls / (PIECES * STEPS)
    for r in rows:
        assert r.timed + r.lost == r.chosen and r.timed >= 0.9 * r.chosen, (r.timed, r.lost,
                                                                             r.chosen)
        assert r.awaiting == 0
        # the report's row says what its median rests on: chosen, timed, lost
        from fxflops.report.figures import row_figures

        fig = row_figures(r, {})
        assert (fig["chosen_calls"], fig["timed_calls"], fig["lost_samples"], fig["calls"]) \
            == (r.chosen, r.samples_taken, r.lost, STEPS)
    assert sim.violations == []


def test_counts_are_exact_from_threads(sim, monkeypatch):
    """Four threads replaying the 60 pieces at once, 160 steps each: every row counts 640
    replays, and its chosen replays are timed or lost, none twice (threads racing to one
    due replay: one is timed, the others run untimed)."""
    monkeypatch.setenv("FXFLOPS_REPLAY_SAMPLE_EVERY", str(EVERY))
    clock = cuda_events.clock(sim)
    served = piecewise(sim, clock)
    errors: list[BaseException] = []

    def replays() -> None:
        try:
            for _ in range(STEPS // 4):
                for g in served.graphs:
                    g.replay()
                sim.step()
        except BaseException as e:  # (the main thread reports it)
            errors.append(e)

    threads = [threading.Thread(target=replays, name=f"replays{i}") for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sim.drain()
    clock.collect(wait_s=1.0, final=True)
    assert errors == []
    rows = served.rows()
    assert [r.count for r in rows] == [STEPS] * PIECES
    assert clock.replays == PIECES * STEPS
    for r in rows:
        assert FIRST <= r.chosen <= STEPS
        assert r.timed + r.lost == r.chosen and r.timed >= 0.9 * r.chosen
    assert not clock.queue.pending and sim.violations == []


@pytest.mark.parametrize("fixed", [False, True], ids=["random", "fixed-control"])
def test_no_step_times_more_than_12_pieces(sim, monkeypatch, fixed):
    """Past the first 16 steps (where each piece's first replays are all timed), no step
    times more than 12 of the 60 pieces: the random strides keep them apart. The control:
    a fixed stride of 32 times all 60 pieces in the same step."""
    monkeypatch.setenv("FXFLOPS_REPLAY_SAMPLE_EVERY", str(EVERY))
    clock = cuda_events.clock(sim)
    if fixed:
        monkeypatch.setattr(clock, "rng", FixedStride())
    served = piecewise(sim, clock)
    serve(sim, clock, served)
    assert served.chosen_per_step[:FIRST] == [PIECES] * FIRST
    most = max(served.chosen_per_step[FIRST:])
    if fixed:
        assert most == PIECES
    else:
        assert most <= 12, most
    assert sim.violations == []


@pytest.mark.parametrize("fixed", [False, True], ids=["random", "fixed-control"])
def test_a_piece_slow_every_32nd_replay_keeps_its_median(sim, monkeypatch, fixed):
    """A piece that takes 2 ms on every 32nd replay and 1 ms otherwise reports a median of
    1 ms (within 1%), and the weighted total time of all 60 pieces is within 5% of what
    their replays took (each constant piece's own within 5% too: a sample stands for half
    the stretch before it and half the one after, so the weights end within half a stride
    of the count). The control: a fixed stride of 32, in step with the slow replays (the
    first one timed after the first 16 is replay 15 + 32), sees only 2 ms there."""
    monkeypatch.setenv("FXFLOPS_REPLAY_SAMPLE_EVERY", str(EVERY))
    clock = cuda_events.clock(sim)
    if fixed:
        monkeypatch.setattr(clock, "rng", FixedStride())
    served = piecewise(sim, clock)
    serve(sim, clock, served, slow=lambda step: 2.0 if step % 32 == 15 else 1.0)
    rows = served.rows()
    slow = rows[0]
    after_first = sorted(slow.samples()[FIRST:])
    if fixed:
        assert set(after_first) == {2_000_000}
        return
    assert abs(slow.percentiles()["median_ms"] - 1.0) <= 0.01
    assert abs(sum(r.total_ns for r in rows) - served.true_ns) <= 0.05 * served.true_ns, (
        sum(r.total_ns for r in rows), served.true_ns)
    for r, ms in zip(rows[1:], served.ms[1:]):
        true = round(ms * 1e6) * STEPS
        assert abs(r.total_ns - true) <= 0.05 * true, (r.total_ns, true)
    assert sim.violations == []


def test_the_same_seed_chooses_the_same_replays(monkeypatch):
    """Two runs replaying in the same order time the same replays (the clock's generator
    is seeded): which steps timed which pieces is the same."""
    monkeypatch.setenv("FXFLOPS_REPLAY_SAMPLE_EVERY", str(EVERY))
    runs = []
    for _ in range(2):
        sim = CudaSim(lag=2, devices=1)
        try:
            clock = cuda_events.clock(sim)
            served = piecewise(sim, clock, pieces=8)
            serve(sim, clock, served, steps=200)
            runs.append((served.chosen_per_step, [r.chosen for r in served.rows()]))
        finally:
            cuda_events._CLOCKS.pop(sim.CUDAGraph, None)
    assert runs[0] == runs[1]


def test_sample_every_1_times_every_replay(sim, monkeypatch):
    """``FXFLOPS_REPLAY_SAMPLE_EVERY=1``: every replay chosen and, once the device caught
    up, timed; each sample stands for its own replay (the total is the samples' sum)."""
    monkeypatch.setenv("FXFLOPS_REPLAY_SAMPLE_EVERY", "1")
    clock = cuda_events.clock(sim)
    served = piecewise(sim, clock, pieces=6)
    serve(sim, clock, served, steps=100)
    for r, ms in zip(served.rows(), served.ms):
        assert r.count == r.chosen == r.timed == 100 and r.lost == 0
        assert r.total_ns == sum(r.samples())
        assert abs(r.total_ns - 100 * round(ms * 1e6)) <= 100  # (1 ns a sample: rounding)
    assert sim.violations == []


def test_the_default_is_one_in_32():
    assert config.REPLAY_SAMPLE_EVERY.default == EVERY


def test_a_bad_value_warns_once_and_samples_at_the_default(sim, monkeypatch, fxflops_log):
    """``FXFLOPS_REPLAY_SAMPLE_EVERY=0`` is no stride: said once, the default taken."""
    monkeypatch.setenv("FXFLOPS_REPLAY_SAMPLE_EVERY", "0")
    clock = cuda_events.clock(sim)
    served = piecewise(sim, clock, pieces=3)
    assert [g._fxflops_entry.every for g in served.graphs] == [EVERY] * 3
    said = [r.getMessage() for r in fxflops_log.records
            if "FXFLOPS_REPLAY_SAMPLE_EVERY" in r.getMessage()]
    assert len(said) == 1 and "using the default 32" in said[0], said
    serve(sim, clock, served, steps=40)
    assert [r.count for r in served.rows()] == [40] * 3


def test_a_replay_that_takes_arguments_is_counted_and_sampled_alike(monkeypatch):
    """torch's ``replay()`` takes no arguments, and fxflops' wrapper then takes none
    either (cheaper); a graph class whose ``replay`` does gets the wrapper that passes
    them on, with the same counts and sampling."""
    monkeypatch.setenv("FXFLOPS_REPLAY_SAMPLE_EVERY", str(EVERY))
    sim = CudaSim(lag=2, devices=1)

    class Graph(sim.CUDAGraph):
        def replay(self, times: int = 1) -> None:
            for _ in range(times):
                super().replay()

    sim.CUDAGraph = Graph
    try:
        clock = cuda_events.clock(sim)
        served = piecewise(sim, clock, pieces=4)
        kinds = {p.kind.name for p in inspect.signature(Graph.replay).parameters.values()}
        assert "VAR_POSITIONAL" in kinds  # (the wrapper that passes arguments on)
        for _ in range(200):
            for g in served.graphs:
                g.replay(times=1)
            sim.step()
        sim.drain()
        clock.collect(final=True)
    finally:
        cuda_events._CLOCKS.pop(Graph, None)
    for r in served.rows():
        assert r.count == 200 and FIRST < r.chosen < 200
        assert r.timed + r.lost == r.chosen
    assert sim.violations == []
