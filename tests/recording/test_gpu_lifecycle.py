"""The GPU path as vLLM drives it, on the CUDA simulator (no GPU here): vLLM's GPU worker
lifecycle for the V1 and V2 runners and each CUDA-graph mode (tests/gpu_lifecycle.py:
memory profiling with its throw-away captures, warm-up, ``capture_model`` for every
capture size, then serving with async scheduling, the device two steps behind the host),
through fxflops' real vLLM hooks and vLLM's real CUDA-graph wrapper and dispatcher
(``CudagraphDispatcher`` on vLLM 0.32/0.33, V2's ``CudaGraphManager`` on 0.34).

vLLM 0.34 has the V2 runner only (it removed ``v1/worker/gpu_model_runner.py`` and
``gpu_ubatch_wrapper.py``): there the V1 cases skip, saying so, and every V1 case has a
V2 one that runs (``test_v1_warm_up_runs_before_capture_stay_out_of_serving``'s is
``test_v2_warm_up_runs_stay_out_of_serving``); the signal runs serve with V2.

The simulator enforces CUDA's rules (capture modes: no synchronise, query or
``elapsed_time`` while a global capture is in progress, from any thread; events done only
when the device reaches them; a current device per thread) and records every violation
even where fxflops swallows the error; each test asserts there were none.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="drives vLLM's own CUDA-graph classes")
pytestmark = pytest.mark.vllm

import fxflops  # noqa: E402
from fxflops.recording import cuda_events, phases  # noqa: E402
from fxflops.report.files import load_reports  # noqa: E402
from tests import procs  # noqa: E402
from tests.cuda_sim import CudaSim  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODES = ("FULL_AND_PIECEWISE", "PIECEWISE", "FULL_DECODE_ONLY")
RUNNERS = ["v1", "v2"]


def need_v1(covered_by: str = "the v2 case covers it") -> None:
    """Skip where vLLM has no V1 runner (0.34), naming what was removed and what covers it."""
    from tests.gpu_lifecycle import v1_runner_missing

    missing = v1_runner_missing()
    if missing:
        pytest.skip(f"{missing}: {covered_by}")


@pytest.fixture
def server(monkeypatch):
    """``make(runner, mode)``: a started vLLM worker on a simulated GPU (device 2 behind)."""
    from tests.gpu_lifecycle import Server

    made = []

    def make(runner: str, mode: str, **kwargs) -> Server:
        if runner == "v1":
            need_v1()
        sim = CudaSim(lag=2, devices=1)
        s = Server(sim, monkeypatch, runner=runner, mode=mode, **kwargs)
        made.append(s)
        s.start()
        return s

    yield make
    from vllm.compilation.cuda_graph import CUDAGraphWrapper

    from fxflops.integrations.vllm import hooks

    hooks.uninstall()
    CUDAGraphWrapper.clear_all_graphs()
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper

    BreakableCUDAGraphWrapper.clear_all_graphs()
    for s in made:
        cuda_events._CLOCKS.pop(s.sim.CUDAGraph, None)


def serving_calls(rec) -> dict[str, int]:
    return {g.name: sum(r.count for r in g.rows.values()) for g in rec.graphs}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("runner", RUNNERS)
def test_every_replay_counts_where_it_is_served(server, runner, mode):
    """Start-up (profile run, throw-away captures, warm-up, capture of every size) leaves
    the serving rows empty; 120 served steps count 120 calls of each piece, each step
    exactly once, whether it ran eager, as piecewise replays or as a FULL replay; a step
    that replayed any graph is ``captured`` under V1 and V2 alike; every whole forward is
    timed once the device caught up; no illegal CUDA call."""
    s = server(runner, mode)
    rec = fxflops.recorder()
    assert set(serving_calls(rec).values()) == {0}
    warm = {phase for g in rec.graphs for phase in g.warmup_rows()}
    assert {"profile", "capture"} <= warm
    kinds = s.serve(120)
    s.sim.drain()
    report = rec.to_dict()  # (counts the replays, reads what finished)
    assert set(serving_calls(rec).values()) == {120}
    forwards = report["forward"]
    assert sum(r["calls"] for r in forwards) == 120
    assert sum(r["timed_calls"] for r in forwards) == 120
    decode, captured = kinds["decode"], sum(r["captured"] for r in forwards)
    if mode == "FULL_DECODE_ONLY":  # prefill runs eager: only decode steps replay
        assert captured == decode
    else:  # every decode step, and prefill chunks up to the largest captured size
        assert decode < captured <= 120
    # the warm-up rows hold warm-up only: the profile and capture phases' eager runs
    for g in report["graphs"]:
        assert {r["warmup"] for r in g.get("warmup", [])} <= {"profile", "warmup", "capture"}
        assert sum(r["calls"] for r in g["rows"]) == 120
    assert s.sim.violations == []


@pytest.mark.parametrize("runner", RUNNERS)
def test_piecewise_replays_are_timed_with_the_device_two_behind(server, runner):
    """PIECEWISE: each piece's graph holds one call; its replays are timed by pooled eager
    pairs, which no later replay overwrites: at least 90% timed while the device is still
    two steps behind, all once it caught up."""
    s = server(runner, "PIECEWISE")
    s.serve(200)
    rec = fxflops.recorder()
    rec.to_dict()
    for g in rec.graphs:
        rows = list(g.rows.values())
        calls, timed = sum(r.count for r in rows), sum(r.samples_taken for r in rows)
        assert calls == 200 and timed >= 0.9 * calls, (g.name, calls, timed)
    s.sim.drain()
    rec.to_dict()
    assert all(r.samples_taken == r.count for g in rec.graphs for r in g.rows.values())
    assert s.sim.violations == []


@pytest.mark.parametrize("runner", RUNNERS)
def test_full_graph_pieces_say_how_many_were_timed(server, monkeypatch, tmp_path, runner):
    """A FULL replay is the whole forward (its row timed); its pieces' own times are read
    when the last replay has finished, and the report says how many were: at the final
    flush, timed + lost = calls for every row, and nothing is left in flight."""
    monkeypatch.setenv("FXFLOPS_OUT", str(tmp_path))
    s = server(runner, "FULL_DECODE_ONLY")
    s.serve(100)
    s.sim.drain()
    fxflops.recorder().flush(final=True)  # as at exit
    (report,) = load_reports([tmp_path])
    for g in report["graphs"]:
        for r in g["rows"]:
            assert r["timed_calls"] + r["lost_samples"] == r["calls"]
    assert report["timing"]["in_flight"] == 0
    assert report["timing"]["replays"] > 0


@pytest.mark.parametrize("runner", RUNNERS)
def test_kernel_profiling_takes_serving_calls_only_and_never_breaks_a_capture(
        server, monkeypatch, runner):
    """FXFLOPS_KERNELS: the profiler waits for the device (as torch.profiler does on a
    GPU), which CUDA forbids during a capture: across start-up (captures included) and
    serving, profiling ran on eager serving calls only, N per size, and no capture was
    invalidated. (A kernel map needs Inductor, which these pieces do not go through: each
    piece is given one.)"""
    import torch

    from fxflops.cost.kernels import KernelCost
    from fxflops.instrument import wrap
    from fxflops.recording import kernel_profile

    profiled: list[tuple[str, object]] = []

    def profile(call, row, kernels, device):
        torch.cuda.synchronize()  # what profiling a GPU call does
        profiled.append((phases.phase(), row.size))
        out = call()
        kernel_profile.note(row, 1000, [], 0)  # (the profiled call noted, as the real one)
        return out, True

    monkeypatch.setattr(kernel_profile, "profile", profile)
    real_init = wrap.InstrumentedGraph.__init__

    def with_kernels(self, inner, record, graph_plan, clock=wrap.CPU_CLOCK, boxed=False,
                     dynamo=False, kernels=None):
        record.kernels = [KernelCost("triton_poi_fused_relu_0", 0, tuple(
            n.name for n in graph_plan.cost.nodes), 0, 0, 0)]
        real_init(self, inner, record, graph_plan, clock, boxed, dynamo,
                  kernels=wrap.KernelSetting(2))

    monkeypatch.setattr(wrap.InstrumentedGraph, "__init__", with_kernels)
    s = server(runner, "FULL_AND_PIECEWISE")
    s.serve(60)
    assert s.sim.violations == []
    assert profiled and {phase for phase, _ in profiled} == {phases.SERVING}
    per_size = {}
    for _, size in profiled:
        per_size[size] = per_size.get(size, 0) + 1
    assert max(per_size.values()) <= 2 * 3  # N=2 per size, for each of the 3 pieces


def test_prometheus_counts_every_replay(server):
    """A scrape during serving sees every replay made so far (counted at the scrape)."""
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    s = server("v2", "FULL_AND_PIECEWISE")
    fxflops.recorder().register_prometheus(registry)
    s.serve(50)
    calls = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == "fxflops_graph_calls_total":
                graph = sample.labels["graph"]
                calls[graph] = calls.get(graph, 0) + sample.value
    assert calls and set(calls.values()) == {50.0}
    assert s.sim.violations == []


def serving_rows(rec):
    """{graph name: [its serving rows]}"""
    return {g.name: list(g.rows.values()) for g in rec.graphs}


def assert_served(rec, calls: int, timed_share: float = 0.9) -> None:
    """Every serving call counted (``calls`` per graph), at least ``timed_share`` of them
    timed while the device is still two steps behind."""
    rec.to_dict()
    for name, rows in serving_rows(rec).items():
        n, timed = sum(r.count for r in rows), sum(r.samples_taken for r in rows)
        assert n == calls, (name, n, calls)
        assert timed >= timed_share * n, (name, timed, n)


def assert_whole(rec, sim) -> None:
    """Once the device caught up and the last replays are read: timed + lost = calls."""
    sim.drain()
    cuda_events.collect_all(final=True)
    for rows in serving_rows(rec).values():
        for r in rows:
            assert r.samples_taken + r.lost == r.count, (r.size, r.count, r.samples_taken,
                                                         r.lost)


@pytest.mark.parametrize("runner", RUNNERS)
def test_breakable_graphs_time_each_call_over_its_segments(server, runner):
    """``VLLM_USE_BREAKABLE_CUDAGRAPH``: the whole model one compiled graph, its capture
    broken at each layer's attention (3 layers: 3 graph segments and 3 eager breaks... the
    last segment after the last break). Each call is split across captures: every serving
    call counted, at least 90% timed two steps behind, and each time is its segments'
    (graph and eager alike): 3 x (0.2 + 0.1) = 0.9 ms."""
    from tests.gpu_lifecycle import ATTENTION_MS, PIECE_MS

    s = server(runner, "PIECEWISE", graphs="breakable")
    s.serve(120)
    rec = fxflops.recorder()
    assert_served(rec, 120)
    assert_whole(rec, s.sim)
    whole_ms = 3 * (PIECE_MS + ATTENTION_MS)
    (rows,) = serving_rows(rec).values()
    assert {round(x / 1e6, 4) for r in rows for x in r.samples()} == {round(whole_ms, 4)}
    assert s.sim.violations == []


@pytest.mark.parametrize("runner", RUNNERS)
def test_micro_batched_pieces_are_counted_and_say_they_share_the_stream(server, runner):
    """DBO: each step of 2+ tokens runs as two micro-batches on two threads taking turns on
    one compute stream (a yield mid-piece), FULL steps captured by the main thread while
    the threads run the model (V1's; on vLLM 0.34 V2's micro-batched decode graphs, the
    V1 case being gone). Every micro-batch's piece call is counted in its serving row
    (two per step, one for a 1-token step); eager micro-batched calls are timed, and their
    rows say the time is shared with the other micro-batch's; no call made under the
    capture is lost to the wrong thread; nothing illegal."""
    if runner == "v1":
        need_v1("the v2 case covers micro-batching (V2's UBatchRunner), FULL captures too")
    from tests.gpu_lifecycle import graphs_managed

    mode = "FULL_AND_PIECEWISE" if runner == "v1" or graphs_managed() else "PIECEWISE"
    s = server(runner, mode, dbo=True)
    rng_steps = s.serve(80)
    rec = fxflops.recorder()
    rec.to_dict()
    report = rec.to_dict()
    forwards = sum(r["calls"] for r in report["forward"])
    assert forwards == 80
    # calls per piece: 2 per micro-batched step, 1 per single-token step
    sizes = [r for r in report["forward"]]
    expected = sum(r["calls"] * (2 if r["size"] >= 2 else 1) for r in sizes)
    calls = {name: sum(r.count for r in rows) for name, rows in serving_rows(rec).items()}
    assert set(calls.values()) == {expected}, (calls, expected, rng_steps)
    assert_whole(rec, s.sim)
    eager_shared = [r for rows in serving_rows(rec).values() for r in rows
                    if r.shared and r.samples_taken]
    assert eager_shared, "the micro-batches' eager calls should say they shared the stream"
    for rows in serving_rows(rec).values():
        for r in rows:
            if r.on_device and r.size >= 1 and r.shared:
                assert r.shared <= r.samples_taken
    assert s.sim.violations == []


def test_v2_memory_profiling_captures_are_profile_not_capture(server):
    """V2 profiles its graphs' memory by ``capture_model(profile_only=True)``: every
    piecewise graph (and the two largest FULL) captured and dropped. Their eager warm-up
    runs are "profile" calls, not "capture" ones: the "capture" rows hold the real
    capture's warm-ups only (one per captured size and mode), and ``warmup_kernels``' real
    steps are "warmup" calls (vLLM 0.34: and the sampler's warm-up step after capture, a
    piecewise replay here); serving rows empty."""
    s = server("v2", "PIECEWISE")
    rec = fxflops.recorder()
    by_phase: dict[str, int] = {}
    for g in rec.to_dict()["graphs"]:
        for w in g.get("warmup", []):
            by_phase[(g["name"], w["warmup"])] = by_phase.get((g["name"], w["warmup"]), 0) \
                + w["calls"]
    descs = sum(len(d) for _, d in s.capture_descs())
    assert descs == 4  # (PIECEWISE: one graph per capture size)
    # warmup_kernels' two real steps (0.34: and the sampler's warm-up step)
    warmup_steps = 3 if s.managed else 2
    for g in rec.graphs:
        # profile: the profile run and one eager warm-up per profiled graph (every size)
        assert by_phase[(g.name, "profile")] == 1 + descs
        assert by_phase[(g.name, "capture")] == descs
        assert by_phase[(g.name, "warmup")] == warmup_steps
    assert set(serving_calls(rec).values()) == {0}
    assert s.sim.violations == []


def test_v1_warm_up_runs_before_capture_stay_out_of_serving(server):
    """V1's ``compile_or_warm_up_model``: eager ``_dummy_run`` at each compile size and
    ``kernel_warmup`` before capture, the sampler's after: "warmup" rows, none serving."""
    need_v1("test_v2_warm_up_runs_stay_out_of_serving covers V2's warm-up runs")
    s = server("v1", "FULL_AND_PIECEWISE")
    rec = fxflops.recorder()
    report = rec.to_dict()
    for g in report["graphs"]:
        warm = sum(w["calls"] for w in g.get("warmup", []) if w["warmup"] == "warmup")
        assert warm == 3 + 1  # three dummy runs before capture, the sampler's after
        assert g["rows"] == [] or sum(r["calls"] for r in g["rows"]) == 0
    assert s.sim.violations == []


@pytest.mark.parametrize("mode", MODES)
def test_v2_warm_up_runs_stay_out_of_serving(server, mode):
    """V2's ``compile_or_warm_up_model``: ``warmup_kernels``' real steps before capture (a
    3-token prefill, a 2-request decode: eager, no graph captured yet) and, on vLLM 0.34,
    the sampler's warm-up step after it (8 one-token requests, dispatched as any step: a
    FULL decode graph's replay where the mode has them, else the piecewise graphs'): every
    call of theirs in the "warmup" rows, of those sizes, none in serving; no step was
    timed as a served forward."""
    s = server("v2", mode)
    rec = fxflops.recorder()
    report = rec.to_dict()
    expected = {3: 1, 2: 1, **({8: 1} if s.managed else {})}
    for g in report["graphs"]:
        warm: dict[int, int] = {}
        for w in g.get("warmup", []):
            if w["warmup"] == "warmup":
                warm[w["size"]] = warm.get(w["size"], 0) + w["calls"]
        assert warm == expected, (g["name"], warm)
        assert sum(r["calls"] for r in g["rows"]) == 0
    assert sum(r["calls"] for r in report["forward"]) == 0
    assert s.sim.violations == []


@pytest.mark.parametrize("runner", RUNNERS)
def test_graphs_released_and_captured_again_while_serving_count_on(server, runner):
    """Elastic EP scales while serving: every graph released and captured again. Serving
    calls before and after are all counted in the serving rows (the re-capture's own
    eager warm-ups in "capture" rows), and the old graphs' entries go with them."""
    import gc

    s = server(runner, "FULL_AND_PIECEWISE")
    s.serve(40)
    clock = cuda_events.clock()  # (torch.cuda's: the simulator is installed there)
    before = len(clock.tracker.graphs)
    with phases.warmup("capture"):  # (vLLM's capture_model, as the hooks phase it)
        s.recapture()
    gc.collect()
    assert len(clock.tracker.graphs) <= before  # the released graphs' entries are gone
    s.serve(40, seed=1)
    rec = fxflops.recorder()
    rec.to_dict()  # (counts the FULL graphs' replays, those of released graphs too)
    assert set(serving_calls(rec).values()) == {80}
    assert_whole(rec, s.sim)
    assert s.sim.violations == []


@pytest.mark.parametrize("runner", RUNNERS)
def test_vllms_scale_67_sizes_60_pieces(server, runner):
    """vLLM's default capture sizes (67) and a 60-piece model, PIECEWISE: every serving
    call counted, at least 90% timed with the device two steps behind, timed + lost =
    calls once it caught up, no violation."""
    from tests.gpu_lifecycle import VLLM_SIZES

    assert len(VLLM_SIZES) == 67
    s = server(runner, "PIECEWISE", pieces=60, sizes=VLLM_SIZES, max_tokens=512)
    s.serve(60)
    rec = fxflops.recorder()
    assert len(rec.graphs) == 60
    assert_served(rec, 60)
    assert_whole(rec, s.sim)
    assert s.sim.violations == []


# --- signals inside fxflops' locks: the process ends by its signal, with its report ------

LOCKS = {
    "the CUDA clock's": "clock.lock",
    "a graph record's": "record._lock",
    "the recorder's": "recorder._lock",
    "the phase stack's": "fxflops.recording.phases._PHASE_LOCK",
}


FINALIZE_S = 120.0  # a SIGINT-ed process's finalization after fxflops' last write (below)

SIGNAL_CASES = [*(("SIGTERM", lock) for lock in LOCKS),
                ("SIGINT", "the CUDA clock's"), ("SIGINT", "a graph record's")]


def signal_runner() -> tuple[str, str]:
    """(runner, its module) the signal runs serve with: V1, V2 where vLLM has no V1 runner
    (0.34)."""
    from tests.gpu_lifecycle import v1_runner_missing

    if v1_runner_missing():
        return "v2", "vllm.v1.worker.gpu.model_runner"
    return "v1", "vllm.v1.worker.gpu_model_runner"


@pytest.fixture(scope="module")
def signal_runs(tmp_path_factory):
    """Each case's run, two processes at a time (each mostly waits on vLLM's import); a
    process's end is noted when it ends (polled), not when it is waited for."""
    cases = {case: tmp_path_factory.mktemp("signal") for case in SIGNAL_CASES}
    runner = signal_runner()[0]
    pending, running, results = list(cases), {}, {}
    deadline = time.monotonic() + 600
    while pending or running:
        while pending and len(running) < 2:
            signame, lock = case = pending.pop(0)
            folder = cases[case]
            running[case] = procs.popen(
                [sys.executable, str(ROOT / "tests" / "gpu_lifecycle.py"), runner,
                 "FULL_AND_PIECEWISE", "400", LOCKS[lock], signame, str(folder / "signalled")],
                cwd=ROOT, env={**os.environ, "FXFLOPS_OUT": str(folder / "out")},
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for case, proc in list(running.items()):
            if proc.poll() is not None:
                ended = time.time()
                _, err = procs.finish(proc, timeout=60)
                results[case] = (proc.returncode, ended, err, cases[case])
                del running[case]
        if time.monotonic() > deadline:
            for proc in running.values():
                proc.kill()
            raise AssertionError(f"signal runs past 600 s: {sorted(running)}")
        time.sleep(0.05)
    return results


# a process that imported vLLM as the runs below import it (their runner's module) and ends
# by an unhandled KeyboardInterrupt, without fxflops: how it ends (by SIGINT, as Python ends
# a process so; vLLM 0.33 on torch 2.14: exit status 1, whatever else runs), and how long
# its shutdown takes from the exception (Python unwinding vLLM's modules and threads)
INTERRUPTED = ("import time, vllm.compilation.cuda_graph, {runner_module}\n"
               "print(time.time(), flush=True)\n"
               "raise KeyboardInterrupt")


@pytest.fixture(scope="module")
def interrupted() -> tuple[int, float]:
    """(exit status, seconds from the exception to the exit) of ``INTERRUPTED``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXFLOPS")}
    script = INTERRUPTED.format(runner_module=signal_runner()[1])
    proc = procs.run([sys.executable, "-c", script], timeout=300, cwd=ROOT, env=env)
    raised = float(proc.stdout.strip().splitlines()[-1])
    return proc.returncode, time.time() - raised


@pytest.mark.parametrize(("signame", "lock"), SIGNAL_CASES)
def test_a_signal_inside_an_fxflops_lock_ends_the_process_with_its_report(
        signal_runs, interrupted, signame, lock):
    """A served vLLM worker (simulated GPU, whose device stops: a hung GPU) gets SIGTERM or
    SIGINT while its main thread holds one of fxflops' locks: the handler's flush must not
    wait for that lock or for the device without bound. Its report is written within 5 s
    of the signal, whole, with the steps served, and the process ends by that signal:
    SIGTERM within 5 s (SIGINT's default action is an exception that unwinds the host's
    stack and shuts Python down, vLLM included, before the exit's own report: that report
    written 15 s beyond what that shutdown takes without fxflops, the process ended within
    ``FINALIZE_S`` of it, as one without fxflops ends by it: ``interrupted``)."""
    returncode, ended, stderr, folder = signal_runs[signame, lock]
    marker, out = folder / "signalled", folder / "out"
    assert marker.exists(), (returncode, stderr[-2000:])
    expected = interrupted[0] if signame == "SIGINT" else -signal.SIGTERM
    assert returncode == expected, (returncode, expected, stderr[-2000:])
    signalled = float(marker.read_text())
    took = ended - signalled
    (path,) = out.glob("fxflops-*.json")
    written = path.stat().st_mtime - signalled  # (the last write: SIGINT's is at exit)
    limit = 5.0 if signame == "SIGTERM" else 15.0 + interrupted[1]
    # SIGINT: after fxflops' exit flush, only Python's finalization is left, whose garbage
    # collections walk every object of a process that served a compiled vLLM model (about
    # 870,000 here, 0.7 s a collection): 5 s here alone, 10 to 16 s with three runs at
    # once, 31 s on CI's 2-core host beside a busy test worker. Bounded so that a hang shows.
    ended_by = limit if signame == "SIGTERM" else written + FINALIZE_S
    assert written < limit and took < ended_by, \
        f"{signame}: report {written:.2f} s, exit {took:.2f} s"
    (report,) = load_reports([out])
    assert sum(r["calls"] for r in report["forward"]) >= 5
    print(f"{signame} inside {lock} lock: report {written:.2f} s, exit {took:.2f} s after it")


@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL_AND_PIECEWISE"])
@pytest.mark.parametrize("runner", RUNNERS)
def test_uncompiled_forwards_under_breakable_graphs_are_counted(server, runner, mode,
                                                                monkeypatch):
    """Breakable CUDA graphs as vLLM 0.34 turns them on (compilation mode NONE: nothing
    compiled, the model run eagerly and its captures broken at attention): the model's
    forwards counted from the ops they run, at its own ``forward``. Start-up censuses
    each size in its eager warm-up run before the capture; every served step (a
    breakable replay, a FULL replay, or eager) is one call of the model in its serving
    row at the step's padded size, its FLOPs by hand (3 layers x 2·T·H·H), so the
    ``<forward>`` rows carry them; replays are counted and timed; the report says why
    nothing was compiled; nothing illegal."""
    from tests.gpu_lifecycle import HIDDEN

    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "1")
    s = server(runner, mode, graphs="uncompiled")
    rec = fxflops.recorder()
    assert set(serving_calls(rec).values()) == {0}  # start-up: warm-up rows only
    kinds = s.serve(120)
    s.sim.drain()
    report = rec.to_dict()
    (graph,) = report["graphs"]
    assert graph["meta"]["uncompiled"] == (
        "vLLM compiled no graph of it (compilation mode NONE: breakable CUDA graphs, "
        "VLLM_USE_BREAKABLE_CUDAGRAPH=1)")
    assert not report["uninstrumented"]
    rows = {r["size"]: r for r in graph["rows"]}
    forwards = {r["size"]: r for r in report["forward"]}
    assert rows.keys() == forwards.keys() and len(rows) > 3
    for size, row in rows.items():
        assert row["calls"] == forwards[size]["calls"]
        assert row["matmul_flops"] == forwards[size]["matmul_flops"] \
            == 3 * 2 * size * HIDDEN * HIDDEN
    assert sum(r["calls"] for r in forwards.values()) == 120
    assert sum(r["timed_calls"] for r in rows.values()) >= 0.9 * 120
    # every decode step replayed a graph (breakable or FULL), and its call was counted
    assert sum(r["captured"] for r in forwards.values()) >= kinds["decode"]
    assert {r["warmup"] for r in graph.get("warmup", [])} >= {"capture"}
    assert s.sim.violations == []
