"""All GPU checks of fxflops in one command (goal: within 6 minutes on one H200, from a cold
Inductor cache).

    python scripts/gpu_check.py            # every check, each in a process of its own
    python scripts/gpu_check.py --one NAME # one check, here (prints its RESULT line)

Each check runs in its own subprocess with its own timeout (``CHECKS``), so that a hung
device or a slow cold compile fails that check, not the session. One line per check: its
figure, its goal, PASS/FAIL/SKIP and the seconds it took; the total time at the end.

Every check also runs a *negative control*: the same comparison against a deliberately
wrong reference (hand events around two calls instead of one, a sample cap that drops
samples, a capture another thread invalidates ...), reusing the check's own measurements.
The control must miss the goal; a check whose control meets it is a FAIL ("control did
not fail"): its goal could not have caught an error.

  events      per-call times of compiled calls against hand-placed CUDA events (2%)
  host        host cost per call at a decode size where the device is starved (batch 1)
  in_flight   calls counted with work in flight; after a device sync every call timed, none
              lost (so "lost" cannot hide read errors)
  graphs      CUDA graphs: a captured call replayed with the host ahead (every replay
              counted, times within 20% of the check's own pair around each replay()), the
              event nodes' cost on the device and on the host against the same graph
              captured without fxflops, the nodes fxflops adds (counted in the graph's dump),
              and a graph holding two calls (a FULL graph's shape)
  replay_host host time added per replay of piecewise graphs at the default sampling
              (FXFLOPS_REPLAY_SAMPLE_EVERY: every replay counted, one in 32 timed): 60
              graphs, 6,000 replays a round, against the bare graphs (goal: 1 us); every
              replay counted, 90% of those chosen timed
  thread      a capture held by one thread while another runs the model on the capturing
              stream (vLLM's micro-batching, DBO): its replays counted
  hammer      a thread flushing the report in a loop during 50 captures: none invalidated,
              every replay afterwards counted
  training    the backward graph's time within the whole backward's
  peak        bf16 matmul TFLOP/s and copy GB/s against the device table (50%)
  vllm        vLLM V1 and V2 runners (mode 3): every graph's calls equal the steps served
              (where vLLM with CUDA is importable; else SKIP)
  kernels     Inductor kernels mapped and timed from the profiler, none unmatched

It first installs fxflops with ``pip install --no-deps -e .`` (the machine's torch stays).
tests/test_gpu_check.py rehearses every check and control on a CPU (small, the CUDA
simulator as ``torch.cuda``), so that one that would raise is found before a GPU is lent.
Exit status: 0 when every check met its goal, 1 when any missed it or failed, 2 without a
GPU (nothing was checked).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# where the checks run, and by how much their sizes shrink: "cuda" and 1 here; a rehearsal
# on a CPU (tests/test_gpu_check.py, with the CUDA simulator as torch.cuda) runs each
# check's code small, so that a check that would raise is found before a GPU is lent
DEVICE = "cuda"
SHRINK = 1
# the backend inside fxflops, and the bare copy's: the rehearsal swaps in one that also
# runs simulated device work, so that its events have something to time
INNER: Any = "inductor"
RESULT = "RESULT "  # a child's last stdout line: RESULT {json}


def shrunk(size: int) -> int:
    """A size of a check, shrunk for a rehearsal."""
    return max(8, size // SHRINK)


@dataclasses.dataclass
class Outcome:
    """What a check measured: its goal met (None: not run here, SKIP), the line that says
    so, and the control's verdict under the same goal (must be False)."""

    ok: bool | None
    figure: str
    control: bool | None = None
    control_figure: str = ""


def verdict(o: Outcome) -> str:
    if o.ok is None:
        return "SKIP"
    if o.control:
        return "FAIL"  # the goal let a wrong reference through: it proves nothing
    return "PASS" if o.ok else "FAIL"


def describe(o: Outcome) -> str:
    if o.control is None:
        return o.figure
    said = "control did not fail" if o.control else "control failed, as it must"
    return f"{o.figure}; {said}: {o.control_figure}"


# --- shared pieces -----------------------------------------------------------------------

def mlp(hidden: int, layers: int):
    import torch

    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(hidden, 4 * hidden, bias=False), torch.nn.GELU(),
                   torch.nn.Linear(4 * hidden, hidden, bias=False)]
    return torch.nn.Sequential(*blocks).to(DEVICE, torch.bfloat16).eval()


def shared_model():
    """The model most checks use, one shape for all: the first process compiles it, the
    later ones find it in Inductor's cache. 137 GFLOP a call (~0.25 ms on an H200, several
    times a compiled call's host time): the device is the bottleneck, so events recorded
    back to back on the stream time the work, not the host's gaps."""
    import torch

    model = mlp(shrunk(4096), 2)
    x = torch.randn(shrunk(256), shrunk(4096), device=DEVICE, dtype=torch.bfloat16)
    return model, x


def compiled_pair(model, example):
    """The model compiled through fxflops (``INNER`` inside), fxflops' graph object, and the
    graph's inputs as Dynamo passes them (the parameters among them: ``graph(*inputs)``).
    The checks count from marks taken after this first call (the compile)."""
    import torch

    import fxflops

    torch._dynamo.reset()
    captured = {}
    fx = fxflops.backend(inner=INNER)

    def capture(gm, example_inputs):
        captured["inputs"] = list(example_inputs)
        captured["ours"] = fx(gm, example_inputs)
        return captured["ours"]

    compiled = torch.compile(model, backend=capture)
    with torch.no_grad():
        compiled(example)
    return compiled, captured["ours"], captured["inputs"]


def pair():
    import torch

    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def settle() -> None:
    """The device drained, and every CUDA-event sample fxflops holds read."""
    import torch

    from fxflops.recording import cuda_events

    torch.cuda.synchronize()
    cuda_events.collect_all(wait_s=5.0, final=True)


def tally(record) -> tuple[int, int, int]:
    """(calls, timed, lost) over a graph's serving rows."""
    rows = list(record.rows.values())
    return (sum(r.count for r in rows), sum(r.timed for r in rows), sum(r.lost for r in rows))


def since(now: tuple[int, ...], before: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(a - b for a, b in zip(now, before))


def new_samples_ms(row, timed_before: int) -> list[float]:
    """The samples a row took since it had ``timed_before`` (the last ``cap`` of them)."""
    first = max(timed_before, row.timed - row.cap)
    return [row.window[i % row.cap] / 1e6 for i in range(first, row.timed)]


def only_row(record):
    (row,) = record.rows.values()
    return row


def med(values) -> float:
    values = list(values)
    return statistics.median(values) if values else 0.0


def within(ours: float, ref: float, tol: float) -> bool:
    return ours > 0 and ref > 0 and abs(ours - ref) <= tol * ref


def pct(ours: float, ref: float) -> str:
    return f"{100 * (ours - ref) / ref:+.1f}%" if ref else "n/a"


@contextlib.contextmanager
def replays_sampled(every: int) -> Iterator[None]:
    """Graphs captured inside time one replay in ``every`` (FXFLOPS_REPLAY_SAMPLE_EVERY,
    read when a graph is captured; 1: every replay, which the checks that compare each
    replay's time with their own pair, or count every replay timed, need)."""
    name = "FXFLOPS_REPLAY_SAMPLE_EVERY"
    old = os.environ.get(name)
    os.environ[name] = str(every)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


# --- the checks --------------------------------------------------------------------------

def check_events(iters: int = 200) -> Outcome:
    """Per-call times of eager compiled calls against hand-placed events around each call;
    control: hand events around two calls."""
    import torch

    model, x = shared_model()
    compiled, ours, _ = compiled_pair(model, x)
    settle()
    before = tally(ours.record)
    row = only_row(ours.record)
    timed_before = row.timed
    marks = []
    with torch.no_grad():
        for _ in range(iters):
            s, e = pair()
            s.record()
            compiled(x)
            e.record()
            marks.append((s, e))
    settle()
    calls, timed, lost = since(tally(ours.record), before)
    ours_ms = med(new_samples_ms(row, timed_before))
    hand_ms = med(s.elapsed_time(e) for s, e in marks)
    two_ms = med(a[0].elapsed_time(b[1]) for a, b in zip(marks, marks[1:]))

    def goal(ref: float) -> bool:
        return within(ours_ms, ref, 0.02) and calls == timed == iters and lost == 0

    return Outcome(goal(hand_ms), (
        f"median per call: fxflops {ours_ms:.4f} ms, hand events {hand_ms:.4f} ms "
        f"({pct(ours_ms, hand_ms)}); {calls}/{iters} counted, {timed} timed, {lost} lost "
        "(goal: within 2%, every call timed)"),
        goal(two_ms), f"hand events around 2 calls {two_ms:.4f} ms ({pct(ours_ms, two_ms)})")


# what fxflops may add to a call's host time: two event records and its bookkeeping
# (benchmarks/gpu_overhead.py: ~3.4 us of its Python per replay, ~13.5 us per call through
# torch.compile on this project's slow 2-core VM). At a starved decode size a call's wall
# time is its host time, so a share of it is no fixed goal; 10 us is 1% of a 1 ms decode
# forward run as one graph call
HOST_GOAL_US = 10.0


def check_host(iters: int = 300, rounds: int = 7) -> Outcome:
    """Host cost per call at batch 1 with a tiny hidden size (the device starved: each
    call's wall time is its host time), fxflops against the bare compiled graph, rounds
    interleaved, the fastest round of each; control: the bare graph called twice."""
    import torch

    model = mlp(shrunk(256), 2)
    x = torch.randn(1, shrunk(256), device=DEVICE, dtype=torch.bfloat16)
    _, ours, inputs = compiled_pair(model, x)
    bare = ours.inner

    def twice(*args):
        bare(*args)
        return bare(*args)

    def wall(fn) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn(*inputs)
        torch.cuda.synchronize()
        return 1e6 * (time.perf_counter() - t0) / iters

    with torch.no_grad():
        got = [(wall(bare), wall(ours), wall(twice)) for _ in range(rounds)]
    b, o, c = (min(r[i] for r in got) for i in range(3))
    added, control_added = o - b, c - b
    return Outcome(added <= HOST_GOAL_US, (
        f"batch-1 forward: bare {b:.1f} us, instrumented {o:.1f} us per call: fxflops adds "
        f"{added:.2f} us = {100 * added / b:.1f}% (goal: at most {HOST_GOAL_US:g} us)"),
        control_added <= HOST_GOAL_US, f"a second bare call adds {control_added:.2f} us")


def check_in_flight(iters: int = 200) -> Outcome:
    """Calls in the report equal calls made while their work is still in flight; after a
    device sync and a flush every call is timed and none lost; control: the same calls
    with the clock's in-flight cap at 1, which gives samples up (lost > 0)."""
    import torch

    import fxflops
    from fxflops.recording import cuda_events

    model, x = shared_model()
    compiled, ours, _ = compiled_pair(model, x)
    name = ours.record.name
    if not os.environ.get("FXFLOPS_OUT"):  # (a flush writes only where there is a folder)
        os.environ["FXFLOPS_OUT"] = tempfile.mkdtemp(prefix="fxflops-gpu-check-")

    def report() -> tuple[int, int, int]:
        (g,) = [g for g in fxflops.recorder().to_dict()["graphs"] if g["name"] == name]
        return (sum(r["calls"] for r in g["rows"]), sum(r["timed_calls"] for r in g["rows"]),
                sum(r["lost_samples"] for r in g["rows"]))

    def run() -> tuple[bool, tuple[int, int, int], tuple[int, int, int]]:
        settle()
        before = report()
        with torch.no_grad():
            for _ in range(iters):
                compiled(x)
        in_flight = cuda_events.status()["in_flight"]
        now = since(report(), before)
        torch.cuda.synchronize()
        fxflops.recorder().flush()
        after = since(report(), before)
        ok = now[0] == iters and after == (iters, iters, 0)
        return ok, now + (in_flight,), after

    ok, now, after = run()
    clock = ours.clock.clock  # the process's CudaClock, as fxflops' graph holds it
    cap, clock.queue.max_in_flight = clock.queue.max_in_flight, 1
    try:
        control, _, c_after = run()
    finally:
        clock.queue.max_in_flight = cap
    return Outcome(ok, (
        f"{iters} calls made, {now[3]} samples in flight at the report, which counted "
        f"{now[0]} calls; after a sync and a flush: {after[0]} calls, {after[1]} timed, "
        f"{after[2]} lost (goal: every call counted; then every call timed, none lost)"),
        control, f"in-flight cap 1: {c_after[1]} timed, {c_after[2]} lost")


def debug_graph():
    """A CUDA graph whose nodes can be dumped (``graph_nodes``)."""
    import torch

    g = torch.cuda.CUDAGraph()
    g.enable_debug_mode()
    return g


def graph_nodes(g) -> int:
    """The nodes of a captured graph, counted in its DOT dump (cudaGraphDebugDotPrint
    names each node graph_<id>_node_<n>)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "graph.dot")
        g.debug_dump(path)
        text = Path(path).read_text()
    return len(set(re.findall(r"graph_\d+_node_\d+", text)))


# what fxflops' event nodes may cost a replay on the device, and its wrapper on the host
REPLAY_DEVICE_GOAL = 0.05
REPLAY_HOST_GOAL_US = 10.0


def check_graphs(replays: int = 100) -> Outcome:
    """CUDA graphs, on plain torch.compile as vLLM drives them: a compiled call captured
    (a piecewise graph: fxflops puts an eager pair around each replay) and replayed with the
    host ahead, interleaved with the same graph captured without fxflops (the bare compiled
    graph); then a graph holding two calls (a FULL graph's shape), replayed with a sync
    between replays (its per-call times are read when the previous replay has finished).
    Controls: the check's pairs from one replay of fxflops' graph to the end of the next
    (the bare replay between them included), and a replay's time taken for a call's."""
    import torch

    model, x = shared_model()
    _, ours, inputs = compiled_pair(model, x)
    bare = ours.inner
    side = torch.cuda.Stream()
    with torch.no_grad():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the default stream, as torch asks
            for _ in range(2):
                ours(*inputs), bare(*inputs)
        torch.cuda.current_stream().wait_stream(side)
        one, plain, full = debug_graph(), debug_graph(), debug_graph()
        with replays_sampled(1), torch.cuda.graph(one):  # (each replay against its pair)
            ours(*inputs)
        with torch.cuda.graph(plain):
            bare(*inputs)
        with torch.cuda.graph(full):
            ours(*inputs)
            ours(*inputs)
    nodes = (graph_nodes(one), graph_nodes(plain), graph_nodes(full))
    added_one, added_full = nodes[0] - nodes[1], nodes[2] - 2 * nodes[1]
    settle()
    row = only_row(ours.record)
    before, timed_before = tally(ours.record), row.timed
    # piecewise: replays with the host ahead, each between the check's own pair, fxflops'
    # graph and the bare one interleaved (the same device state for both)
    ours_marks, bare_marks = [], []
    for _ in range(replays):
        for g, marks in ((one, ours_marks), (plain, bare_marks)):
            s, e = pair()
            s.record()
            g.replay()
            e.record()
            marks.append((s, e))
    settle()
    calls, timed, lost = since(tally(ours.record), before)
    fx_ms = med(new_samples_ms(row, timed_before))
    hand_ms = med(s.elapsed_time(e) for s, e in ours_marks)
    bare_ms = med(s.elapsed_time(e) for s, e in bare_marks)
    two_ms = med(a[0].elapsed_time(b[1]) for a, b in zip(ours_marks, ours_marks[1:]))
    node_cost = hand_ms - bare_ms

    # host cost per replay: loops of replays, nothing waited for inside, fastest round
    def host_us(g) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(replays):
            g.replay()
        return 1e6 * (time.perf_counter() - t0) / replays

    rounds = [(host_us(one), host_us(plain)) for _ in range(5)]
    settle()
    host_ours, host_bare = min(r[0] for r in rounds), min(r[1] for r in rounds)
    # FULL-like: two calls in one graph, a sync between replays
    before, timed_before = tally(ours.record), row.timed
    full_marks = []
    for _ in range(replays):
        s, e = pair()
        s.record()
        full.replay()
        e.record()
        full_marks.append((s, e))
        torch.cuda.synchronize()
    settle()
    f_calls, f_timed, f_lost = since(tally(ours.record), before)
    per_call_ms = med(new_samples_ms(row, timed_before))
    full_ms = med(s.elapsed_time(e) for s, e in full_marks)

    def goal(piece_ref: float, full_ref: float) -> bool:
        return (within(fx_ms, piece_ref, 0.2) and calls == timed == replays and lost == 0
                and within(2 * per_call_ms, full_ref, 0.2)
                and f_calls == 2 * replays and f_timed + f_lost == f_calls
                and f_timed >= f_calls // 4 and added_one == 2 and added_full == 4
                and node_cost <= REPLAY_DEVICE_GOAL * bare_ms
                and host_ours - host_bare <= REPLAY_HOST_GOAL_US)

    figure = (
        f"piecewise: {replays} replays, host ahead: {calls} counted, {timed} timed, {lost} "
        f"lost, median fxflops {fx_ms:.4f} ms vs the check's pair {hand_ms:.4f} ms "
        f"({pct(fx_ms, hand_ms)}); event nodes: {added_one} added to a 1-call graph of "
        f"{nodes[1]}, {added_full} to a 2-call graph; their device cost {1e3 * node_cost:+.1f} "
        f"us a replay ({pct(hand_ms, bare_ms)} of the bare graph's {bare_ms:.4f} ms); host "
        f"per replay {host_ours:.1f} us vs bare {host_bare:.1f} us "
        f"({host_ours - host_bare:+.1f} us); FULL-like (2 calls, synced): {f_calls} counted, "
        f"{f_timed} timed, {f_lost} lost, 2 x {per_call_ms:.4f} ms vs the replay's "
        f"{full_ms:.4f} ms (goal: every replay counted, timed within 20%, 2 nodes a call, "
        f"device cost <= {REPLAY_DEVICE_GOAL:.0%}, host <= {REPLAY_HOST_GOAL_US:g} us, FULL "
        "timed + lost = calls, timed >= 25%)")
    control = goal(two_ms, full_ms) or goal(hand_ms, 2 * full_ms)
    return Outcome(goal(hand_ms, full_ms), figure, control,
                   f"pairs from a replay to the next one's end {two_ms:.4f} ms, or a replay taken for a call "
                   f"({pct(per_call_ms, full_ms)})")


# what fxflops may add to the host's time of a piecewise replay at the default sampling
# (issue 48: 60 pieces at 50 steps/s are 3,000 replays a second)
REPLAY_SAMPLED_GOAL_US = 1.0


def check_replay_host(graphs: int = 60, steps: int = 100, warm: int = 20,
                      rounds: int = 5) -> Outcome:
    """Host time fxflops adds per replay of vLLM-like piecewise graphs at
    FXFLOPS_REPLAY_SAMPLE_EVERY's default (every replay counted, a row's first 16 then one
    in 32 timed): ``graphs`` CUDA graphs of a compiled batch-1 call, each replayed once a
    step, ``steps`` steps a round after ``warm`` steps (past the first replays, all
    timed), the host's time from a step's first launch to its last (the device
    synchronised between steps, outside it), against as many graphs captured from the bare
    compiled graph, rounds interleaved, the fastest round of each. Every replay must be
    counted, and once read at least 90% of those chosen timed (timed + lost = chosen).
    Control: graphs of the same call captured with FXFLOPS_REPLAY_SAMPLE_EVERY=1 (every
    replay timed: two records, a query and an elapsed time each), which must miss the
    goal."""
    import torch

    model = mlp(shrunk(256), 2)
    x = torch.randn(1, shrunk(256), device=DEVICE, dtype=torch.bfloat16)
    _, ours, inputs = compiled_pair(model, x)
    _, each, _ = compiled_pair(model, x)  # (a record of its own: rows of its own)
    bare = ours.inner
    side = torch.cuda.Stream()
    with torch.no_grad():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the default stream, as torch asks
            for fn in (ours, each, bare):
                fn(*inputs)
        torch.cuda.current_stream().wait_stream(side)

        def capture(fn: Callable[..., Any]) -> list[Any]:
            made = []
            for _ in range(graphs):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    fn(*inputs)
                made.append(g)
            return made

        from fxflops import config

        with replays_sampled(config.REPLAY_SAMPLE_EVERY.default):
            sampled = capture(ours)
        plain = capture(bare)
        with replays_sampled(1):
            timed_each = capture(each)
    settle()
    before, each_before = tally(ours.record), tally(each.record)
    row = only_row(ours.record)
    chosen_before = row.chosen

    def step(gs: list[Any]) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for g in gs:
            g.replay()
        return time.perf_counter() - t0

    for _ in range(warm):
        for gs in (sampled, plain, timed_each):
            step(gs)
    got = []
    for _ in range(rounds):
        got.append([1e6 * sum(step(gs) for _ in range(steps)) / (steps * graphs)
                    for gs in (plain, sampled, timed_each)])
    settle()
    b, o, c = (min(r[i] for r in got) for i in range(3))
    added, control_added = o - b, c - b
    calls, timed, lost = since(tally(ours.record), before)
    c_calls, _, _ = since(tally(each.record), each_before)
    chosen = row.chosen - chosen_before
    replays = graphs * (warm + rounds * steps)
    counted = calls == replays and c_calls == replays
    read = timed + lost == chosen and timed >= 0.9 * chosen and 0 < chosen < replays

    def goal(extra_us: float) -> bool:
        return extra_us <= REPLAY_SAMPLED_GOAL_US and counted and read

    return Outcome(goal(added), (
        f"piecewise replays, host time per replay: bare {b:.2f} us, fxflops {o:.2f} us "
        f"({added:+.2f} us) at the default sampling, {graphs} graphs x {steps} steps a "
        f"round ({graphs * steps} replays), the fastest of {rounds}; {calls}/{replays} "
        f"replays counted, {chosen} chosen, {timed} timed, {lost} lost (goal: at most "
        f"{REPLAY_SAMPLED_GOAL_US:g} us added, every replay counted, 90% of those chosen "
        "timed)"),
        goal(control_added), f"every replay timed (FXFLOPS_REPLAY_SAMPLE_EVERY=1): "
        f"{control_added:+.2f} us a replay, {c_calls}/{replays} counted")


def run_on_thread(fn: Callable[[], Any], ready: threading.Event,
                  go: threading.Event) -> threading.Thread:
    """A thread that warms up (``fn`` once), says ready, waits for ``go``, calls ``fn``."""
    errors: list[BaseException] = []

    def body():
        try:
            fn()
            ready.set()
            go.wait(timeout=30)
            fn()
        except BaseException as e:  # (the main thread reports it)
            errors.append(e)
            ready.set()

    t = threading.Thread(target=body, name="ubatch")
    t.errors = errors  # type: ignore[attr-defined]
    t.start()
    return t


def check_thread(replays: int = 20) -> Outcome:
    """A capture held by the main thread while another thread runs the model on the
    capturing stream, as vLLM's micro-batching does (vllm/v1/worker/gpu_ubatch_wrapper.py:
    ``torch.cuda.graph(g, stream=compute_stream)`` on the main thread, the model called
    on ubatch threads that set that stream; global capture mode): every replay counted.
    Control: the same capture of the bare graph, whose calls nothing counts. (fxflops finds
    the capture by the call's stream: the thread holds none of its own.)"""
    import torch

    model, x = shared_model()
    compiled, ours, inputs = compiled_pair(model, x)
    stream = torch.cuda.Stream()

    def captured_on_thread(fn) -> tuple[Any, list]:
        g = torch.cuda.CUDAGraph()
        ready, go = threading.Event(), threading.Event()

        def model_call():
            with torch.no_grad(), torch.cuda.stream(stream):
                fn()

        t = run_on_thread(model_call, ready, go)
        ready.wait(timeout=30)
        torch.cuda.synchronize()
        # (every replay timed: the goal is each one counted and timed)
        with replays_sampled(1), torch.cuda.graph(g, stream=stream):
            go.set()
            t.join(timeout=30)
        return g, t.errors

    ours_graph, errors = captured_on_thread(lambda: compiled(x))
    bare_graph, bare_errors = captured_on_thread(lambda: ours.inner(*inputs))
    if errors or bare_errors:
        e = (errors + bare_errors)[0]
        return Outcome(False, f"the ubatch thread raised {type(e).__name__}: {e}")
    settle()

    def counted(g) -> tuple[int, int, int]:
        before = tally(ours.record)
        for _ in range(replays):
            g.replay()
        settle()
        return since(tally(ours.record), before)

    calls, timed, lost = counted(ours_graph)
    c_calls, _, _ = counted(bare_graph)
    return Outcome(calls == timed == replays and lost == 0, (
        f"capture on the main thread, model on another: {replays} replays, {calls} counted, "
        f"{timed} timed, {lost} lost (goal: every replay counted and timed)"),
        c_calls == replays, f"the bare graph's replays: {c_calls} counted")


def check_hammer(captures: int = 50, replays: int = 2) -> Outcome:
    """A thread reading the report (``to_dict``) and collecting CUDA-event samples in a
    loop while the main thread captures ``captures`` graphs of a compiled call: no capture
    invalidated (capture_end raises nothing), the reader saw captures in progress, and
    every replay afterwards counted and timed. Control: a capture during which another
    thread synchronises the device (illegal in CUDA's global capture mode): it must be
    invalidated, so that the check would see an invalidation."""
    import torch

    import fxflops
    from fxflops.recording import cuda_events

    model, x = shared_model()
    _, ours, inputs = compiled_pair(model, x)
    stop = threading.Event()
    seen = {"rounds": 0, "during_capture": 0, "errors": []}

    def hammer():
        while not stop.is_set():
            try:
                fxflops.recorder().to_dict()
                got = cuda_events.collect_all()
            except Exception as e:  # noqa: BLE001 (counted: the check fails on any)
                seen["errors"].append(f"{type(e).__name__}: {e}")
                continue
            seen["rounds"] += 1
            seen["during_capture"] += got.skipped_capture

    graphs, failures = [], []
    reader = threading.Thread(target=hammer, name="hammer")
    reader.start()
    try:
        with torch.no_grad():
            for _ in range(captures):
                g = torch.cuda.CUDAGraph()
                try:
                    # (every replay timed: the goal is each one counted and timed)
                    with replays_sampled(1), torch.cuda.graph(g):
                        ours(*inputs)
                        # (a capture takes a while in vLLM; here the GIL is let go
                        # inside it, so that the reader does run while it is in progress)
                        time.sleep(0.002)
                    graphs.append(g)
                except Exception as e:  # an invalidated capture: the failure this checks
                    failures.append(f"{type(e).__name__}: {e}")
    finally:
        stop.set()
        reader.join(timeout=30)
    settle()
    before = tally(ours.record)
    for _ in range(replays):
        for g in graphs:
            g.replay()
    settle()
    calls, timed, lost = since(tally(ours.record), before)
    expected = captures * replays
    ok = (not failures and not seen["errors"] and seen["during_capture"] > 0
          and calls == timed == expected and lost == 0)
    figure = (f"{captures} captures, {len(failures)} invalidated, the reader's "
              f"{seen['rounds']} rounds ({seen['during_capture']} during a capture, "
              f"{len(seen['errors'])} raised); then {calls}/{expected} replays counted, "
              f"{timed} timed, {lost} lost (goal: none invalidated, every replay counted)")
    if failures or seen["errors"]:
        figure += f"; first: {(failures + seen['errors'])[0][:300]}"
    # the control: a synchronize from another thread in the middle of a capture
    g = torch.cuda.CUDAGraph()
    invalidated = ""
    try:
        with torch.no_grad(), torch.cuda.graph(g):
            ours(*inputs)
            t = threading.Thread(target=lambda: _swallow(torch.cuda.synchronize))
            t.start()
            t.join(timeout=30)
    except Exception as e:  # the invalidation the control must cause
        invalidated = f"{type(e).__name__}"
    return Outcome(ok, figure, not invalidated,
                   f"a synchronize on another thread mid-capture: capture_end raised "
                   f"{invalidated or 'nothing'}")


def _swallow(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 (the capture_end that follows says what it did)
        pass


def check_training(steps: int = 20) -> Outcome:
    """A compiled training step: the backward graph timed by CUDA events like the forward,
    every step counted and timed, its median between half and 110% of hand events around
    ``loss.backward()`` (the graph is most of the backward's device time at this size).
    Control: hand events around the forward call (half the backward's work)."""
    import torch

    import fxflops

    torch._dynamo.reset()
    narrow, wide = shrunk(2048), shrunk(8192)
    model = torch.nn.Sequential(torch.nn.Linear(narrow, wide), torch.nn.GELU(),
                                torch.nn.Linear(wide, narrow)).to(DEVICE, torch.bfloat16)
    compiled = torch.compile(model, backend=fxflops.backend(inner="inductor"))
    x = torch.randn(shrunk(4096), narrow, device=DEVICE, dtype=torch.bfloat16)
    for _ in range(3):
        compiled(x).float().pow(2).mean().backward()
    settle()
    backward = [g for g in fxflops.recorder().graphs if g.meta.get("phase") == "backward"]
    if not backward:
        return Outcome(False, "training: no backward graph was instrumented")
    record = backward[-1]
    row = only_row(record)
    before, timed_before = tally(record), row.timed
    fwd, bwd = [], []
    for _ in range(steps):
        s, e = pair()
        s.record()
        out = compiled(x)
        e.record()
        fwd.append((s, e))
        loss = out.float().pow(2).mean()
        s, e = pair()
        s.record()
        loss.backward()
        e.record()
        bwd.append((s, e))
    settle()
    calls, timed, lost = since(tally(record), before)
    ours_ms = med(new_samples_ms(row, timed_before))
    bwd_ms = med(s.elapsed_time(e) for s, e in bwd)
    fwd_ms = med(s.elapsed_time(e) for s, e in fwd)

    def goal(ref: float) -> bool:
        return calls == timed == steps and lost == 0 and 0.5 * ref <= ours_ms <= 1.1 * ref \
            and ours_ms > 0

    return Outcome(goal(bwd_ms), (
        f"training: backward graph {calls}/{steps} steps counted, {timed} timed, median "
        f"{ours_ms:.3f} ms vs {bwd_ms:.3f} ms around loss.backward() (goal: every step timed, "
        "between 50% and 110% of the whole backward)"),
        goal(fwd_ms), f"around the forward {fwd_ms:.3f} ms")


def check_peak() -> Outcome:
    """Measured bf16 matmul TFLOP/s and copy GB/s, each at least 50% of the device table's.
    Control: the matmul measured at 256 x 256 (far too small to reach the peak)."""
    import torch

    from fxflops.cli.peak import measure
    from fxflops.peaks.devices import current_peak

    name = torch.cuda.get_device_name()
    table = current_peak(name, "bf16")
    if not table["tflops"] or not table["gbps"]:
        return Outcome(False, f"{name}: not in the device table")
    tflops, gbps = measure(DEVICE, "bf16", shrunk(8192))
    small, _ = measure(DEVICE, "bf16", max(8, 256 // SHRINK))
    mfu, bw = tflops / table["tflops"], gbps / table["gbps"]
    return Outcome(mfu >= 0.5 and bw >= 0.5, (
        f"{name}: bf16 matmul {tflops:.1f} TFLOP/s = {mfu:.1%} of the table's "
        f"{table['tflops']}, copy {gbps:.0f} GB/s = {bw:.1%} of {table['gbps']} (goal: at "
        "least 50% each)"),
        small / table["tflops"] >= 0.5, f"a 256 x 256 matmul: {small:.2f} TFLOP/s")


def vllm_with_cuda() -> str | None:
    """Why vLLM cannot run here (None: it can)."""
    import torch

    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed"
    if not torch.cuda.is_available():
        return "no CUDA"
    try:
        import vllm  # noqa: F401

        return None
    except Exception as e:  # vLLM present and broken here: not this check's goal
        return f"{type(e).__name__}: {e}"


def steps_served(reports: list[dict], extra: int = 0) -> tuple[bool, str]:
    """Every compiled graph's serving calls equal the steps served (the whole-forward
    rows' calls, plus ``extra``: a control's wrong count): each piece runs once a step,
    as a replay or eagerly."""
    steps = sum(r["calls"] for rep in reports for r in rep.get("forward", [])) + extra
    per_graph = {g["name"]: sum(r["calls"] for r in g["rows"])
                 for rep in reports for g in rep["graphs"]}
    ok = steps > 0 and bool(per_graph) and all(n == steps for n in per_graph.values())
    off = {k: v for k, v in per_graph.items() if v != steps}
    return ok, f"{steps} steps, {len(per_graph)} graphs, those off: {dict(list(off.items())[:4])}"


def check_vllm() -> Outcome:
    """vLLM's V1 and V2 model runners in mode 3 (piecewise and FULL CUDA graphs) with
    fxflops: every graph's calls equal the steps served. Control: one step more."""
    why = vllm_with_cuda()
    if why:
        return Outcome(None, f"vLLM V1 and V2: not run (vLLM with CUDA not importable: {why})")
    from fxflops.report.files import load_reports

    lines, oks, controls = [], [], []
    for runner, v2 in (("V1", "0"), ("V2", "1")):
        out = Path(tempfile.mkdtemp(prefix=f"fxflops-vllm-{runner}-"))
        cmd = [sys.executable, str(ROOT / "examples" / "vllm_tiny.py"), str(out), "--mode",
               "3", "--backend", "inductor"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                              preexec_fn=default_signals,
                              env={**os.environ, "FXFLOPS": "1",
                                   "VLLM_USE_V2_MODEL_RUNNER": v2})
        if proc.returncode != 0:
            return Outcome(False, f"vLLM {runner}: the run failed: {proc.stderr[-1500:]}")
        reports = load_reports([out])
        ok, line = steps_served(reports)
        control, _ = steps_served(reports, extra=1)
        oks.append(ok)
        controls.append(control)
        lines.append(f"{runner}: {line}")
    return Outcome(all(oks), "vLLM mode 3: " + "; ".join(lines) +
                   " (goal: every graph's calls = steps served)",
                   any(controls), "one step more")


def check_kernels(calls: int = 5) -> Outcome:
    """An MLP compiled with ``kernels=N``: its Triton kernels and extern GEMMs mapped
    (per-kernel FLOPs adding up to the row's exactly), every kernel timed from the
    profiler's device events, none unmatched, their sum within the call's. Control: the
    same verdict on the row with one kernel left out."""
    import torch

    import fxflops

    fxflops.reset_recorder()
    torch._dynamo.reset()
    model = mlp(shrunk(1024), 2)
    compiled = torch.compile(model, backend=fxflops.backend(kernels=calls))
    x = torch.randn(shrunk(256), shrunk(1024), device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(calls + 5):
            compiled(x)
    settle()
    (graph,) = fxflops.recorder().to_dict()["graphs"]
    (row,) = graph["rows"]
    prof = row.get("kernels_profile") or {}

    def goal(kernels: list[dict]) -> bool:
        triton = [k for k in kernels if k["kernel"].startswith("triton_")]
        return (bool(triton) and sum(k["flops"] for k in kernels) == row["flops"]
                and all(k.get("median_ms") for k in kernels) and prof.get("unmatched") == 0
                and prof.get("kernels_ms", 1e9) <= prof.get("median_ms", 0))

    kernels = row.get("kernels") or []
    triton = [k for k in kernels if k["kernel"].startswith("triton_")]
    timed = [k for k in kernels if k.get("median_ms")]
    exact = sum(k["flops"] for k in kernels) == row["flops"]
    return Outcome(goal(kernels), (
        f"kernels: {len(kernels)} mapped ({len(triton)} Triton), {len(timed)} timed over "
        f"{prof.get('calls')} calls, {prof.get('unmatched')} launches unmatched, FLOPs exact: "
        f"{exact}, in kernels {prof.get('kernels_ms', 0):.3f} of "
        f"{prof.get('median_ms', 0):.3f} ms (goal: Triton kernels mapped, every kernel timed, "
        "none unmatched, within the call)"),
        goal(kernels[1:]), f"{len(kernels) - 1} kernels, one left out")


@dataclasses.dataclass(frozen=True)
class Check:
    fn: Callable[[], Outcome]
    timeout_s: float


# in the order they run; the timeouts add up to 315 s (vLLM's, 300 s more, only where
# vLLM with CUDA is importable): with the install's 45 s and the processes' starts, the
# whole stays within 6 minutes. The first check compiles the shared model cold (~10-20 s
# on an H200 host); the later ones find it in Inductor's cache
CHECKS: dict[str, Check] = {
    "events": Check(check_events, 45),
    "host": Check(check_host, 35),
    "in_flight": Check(check_in_flight, 30),
    "graphs": Check(check_graphs, 40),
    "replay_host": Check(check_replay_host, 15),
    "thread": Check(check_thread, 30),
    "hammer": Check(check_hammer, 35),
    "training": Check(check_training, 40),
    "peak": Check(check_peak, 15),
    "vllm": Check(check_vllm, 300),
    "kernels": Check(check_kernels, 30),
}


# --- running them --------------------------------------------------------------------------

def run_here(name: str) -> dict[str, Any]:
    """One check in this process: its outcome as the RESULT line's JSON (a check that
    raised is a FAIL that says what it raised)."""
    try:
        o = CHECKS[name].fn()
    except Exception as e:  # one failed check must not hide why
        o = Outcome(False, f"failed: {type(e).__name__}: {e}")
    return {"verdict": verdict(o), "line": describe(o)}


def default_signals() -> None:
    """(In a child, before exec.) The default SIGINT and SIGTERM handlers, whatever the
    shell that started this ignores (a background job inherits SIG_IGN)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def run_child(cmd: list[str], timeout_s: float) -> dict[str, Any]:
    """A check's process: its RESULT line, or a FAIL that says why there is none (timed
    out: killed with its whole process group, Inductor's compile workers included)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_signals, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        return {"verdict": "FAIL", "line": f"timed out after {timeout_s:g} s: "
                f"{_tail(err)}"}
    for line in reversed(out.splitlines()):
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    return {"verdict": "FAIL", "line": f"exited {proc.returncode} without a result: "
            f"{_tail(err)}"}


def _tail(text: str | None) -> str:
    lines = [x for x in (text or "").strip().splitlines() if x.strip()]
    return " | ".join(lines[-3:])[-600:]


def plan() -> list[tuple[str, float]]:
    """(name, timeout) of the checks to run here: vLLM's only where it is installed (its
    process says SKIP when it cannot use CUDA)."""
    vllm = importlib.util.find_spec("vllm") is not None
    return [(n, c.timeout_s if n != "vllm" or vllm else 0.0) for n, c in CHECKS.items()]


def install_without_deps() -> None:
    """fxflops as users install it (its entry points: backend="fxflops", the vLLM plugin),
    on the machine's own torch: nothing is fetched (--no-deps: the GPU machine has no
    network, and its torch must stay)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--no-build-isolation", "-e", str(ROOT)], capture_output=True,
                          text=True, timeout=45, preexec_fn=default_signals)
    if proc.returncode != 0:
        # (a Python 3.12 environment may lack setuptools, which --no-build-isolation
        # needs); the checks import fxflops from the source tree (ROOT is on sys.path)
        print("gpu_check: could not install fxflops (--no-deps); running from the source "
              "tree: " + (proc.stderr.strip().splitlines() or ["?"])[-1], flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--one", choices=sorted(CHECKS), help="run one check here")
    args = p.parse_args()
    if args.one:
        print(RESULT + json.dumps(run_here(args.one)), flush=True)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing was checked")
        return 2
    start = time.perf_counter()
    install_without_deps()
    missed = 0
    todo = plan()
    for i, (name, timeout_s) in enumerate(todo, 1):
        t0 = time.perf_counter()
        if timeout_s:
            got = run_child([sys.executable, str(Path(__file__).resolve()), "--one", name],
                            timeout_s)
        else:
            got = {"verdict": "SKIP", "line": f"not run ({vllm_with_cuda()})"}
        missed += got["verdict"] == "FAIL"
        print(f"[{i}] {name} {got['verdict']} {got['line']} ({time.perf_counter() - t0:.1f} s)",
              flush=True)
    print(f"gpu_check: {len(todo) - missed}/{len(todo)} checks met their goal or were "
          f"skipped, in {time.perf_counter() - start:.0f} s")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
