"""scripts/gpu_check.py rehearsed on a CPU: each check's own code (its models, the fxflops
calls it makes, the report keys it reads) and its negative control run small, with the
CUDA simulator (tests/cuda_sim.py) standing in for ``torch.cuda``, so that a check that
would raise on the GPU machine is found here, before a GPU is lent (one session's few
minutes on it).

The graphs are planned for "cuda" and timed by the simulator's events, and the inner
backend runs 1 ms of simulated device work per call (``launching``), so that the checks
that only count and compare event times (events, in_flight, graphs, hammer) meet their
goal here as on a GPU and their controls miss it. What the CPU cannot show (host costs,
Inductor's kernels, peaks, the backward's share) is left to the GPU: for those only that
each runs to its verdict is asserted. The runner (one process per check, each with its
timeout) is tested with a check that hangs and one that raises."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

from tests.cuda_sim import CudaSim
from tests.helpers import compile_on_sim

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check_rehearsed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    # (registered while it runs: its dataclasses look their module up by name)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def launching(sim: CudaSim):
    """An inner backend whose compiled graph runs eagerly and also puts 1 ms of work on the
    (simulated) device, a host step each call (the device two calls behind)."""

    def inner(gm, example_inputs):
        def run(*args):
            sim.step()
            sim.launch(1.0)
            return gm.forward(*args)

        return run

    return inner


@pytest.fixture()
def rehearsal(monkeypatch, tmp_path):
    from fxflops.recording import cuda_events

    module = load_script()
    monkeypatch.setattr(module, "DEVICE", "cpu")
    monkeypatch.setattr(module, "SHRINK", 64)
    # the simulator for the checks' own torch.cuda calls, but torch itself still sees no
    # CUDA (Inductor would look for Triton on a device): the checks' graphs are CPU graphs
    sim = CudaSim(lag=2, devices=1).install(monkeypatch, leave=("is_available", "device_count"))
    monkeypatch.setattr(module, "INNER", launching(sim))
    # graphs planned for "cuda": timed by the simulator's events, captured and replayed
    compile_on_sim(monkeypatch, sim)
    # the simulator's graphs have no DOT dump: their nodes are counted from its own list
    monkeypatch.setattr(module, "debug_graph", lambda: sim.CUDAGraph())
    monkeypatch.setattr(module, "graph_nodes", lambda g: len(g._nodes))
    monkeypatch.setenv("FXFLOPS_OUT", str(tmp_path))  # (the in-flight check's flush writes)
    yield module, sim
    cuda_events._CLOCKS.pop(sim.CUDAGraph, None)


def test_the_checks_meet_their_goal_and_their_controls_miss_it(rehearsal):
    """Where the CPU shows it: counts, event times of 1 ms of simulated work, nodes added
    to a captured graph; every control misses the goal (else the check could not fail)."""
    module, sim = rehearsal
    events = module.check_events(iters=12)
    assert (events.ok, events.control) == (True, False), module.describe(events)
    assert "fxflops 1.0000 ms, hand events 1.0000 ms" in events.figure
    assert "around 2 calls 2.0000 ms" in events.control_figure
    flight = module.check_in_flight(iters=12)
    assert (flight.ok, flight.control) == (True, False), module.describe(flight)
    assert "after a sync and a flush: 12 calls, 12 timed, 0 lost" in flight.figure
    assert "in-flight cap 1: 1 timed, 11 lost" in flight.control_figure, flight.control_figure
    graphs = module.check_graphs(replays=6)
    # every part but the host's cost (CPU Python here, over the 10 us goal on this VM)
    assert "6 counted, 6 timed, 0 lost, median fxflops 1.0000 ms vs the check's pair " \
           "1.0000 ms" in graphs.figure, graphs.figure
    assert "2 added to a 1-call graph of 1, 4 to a 2-call graph" in graphs.figure
    assert "FULL-like (2 calls, synced): 12 counted" in graphs.figure
    assert "2 x 1.0000 ms vs the replay's 2.0000 ms" in graphs.figure
    # (from one replay of fxflops' graph to the end of the next: the bare one between)
    assert graphs.control is False and "to the next one's end 3.0000 ms" in \
        graphs.control_figure
    hammer = module.check_hammer(captures=10, replays=2)
    assert (hammer.ok, hammer.control) == (True, False), module.describe(hammer)
    assert "10 captures, 0 invalidated" in hammer.figure
    assert "then 20/20 replays counted, 20 timed, 0 lost" in hammer.figure
    assert "capture_end raised CudaCaptureError" in hammer.control_figure
    assert not [v for v in sim.violations if v[0] == "hammer"], sim.violations


def test_a_capture_driven_from_another_thread(rehearsal):
    """vLLM's micro-batching: the capture on the main thread, the model on another: the
    call is registered with the capture on its stream, every replay counted and timed;
    the control (the bare graph, counted by nothing) misses."""
    module, sim = rehearsal
    o = module.check_thread(replays=4)
    assert o.ok is True and o.control is False, module.describe(o)
    assert o.figure.startswith("capture on the main thread, model on another: 4 replays, "
                               "4 counted, 4 timed, 0 lost"), o.figure
    assert not sim.violations


def test_the_replay_host_check_counts_every_replay(rehearsal):
    """Piecewise replays at the default sampling: the host's time here is this VM's Python
    over the simulator (the GPU's to judge), but the counts are the check's own: every
    replay counted, those chosen timed or lost, the control's replays counted too."""
    module, sim = rehearsal
    o = module.check_replay_host(graphs=6, steps=10, warm=20, rounds=2)
    assert o.ok in (True, False) and o.control in (True, False), module.describe(o)
    assert o.figure.startswith("piecewise replays, host time per replay: bare"), o.figure
    assert "240/240 replays counted" in o.figure and " 0 lost" in o.figure, o.figure
    assert "240/240 counted" in o.control_figure, o.control_figure
    assert not sim.violations


@pytest.mark.parametrize("check,kwargs,figure", [
    ("check_host", {"iters": 20, "rounds": 2}, "batch-1 forward: bare"),
    ("check_training", {"steps": 3}, "training: backward graph 3/3 steps counted"),
    ("check_peak", {}, "NVIDIA H200 (simulated): bf16 matmul"),
    ("check_kernels", {"calls": 2}, "kernels: "),
])
def test_the_others_run_to_their_verdict(rehearsal, check, kwargs, figure):
    """Host costs, peaks, Inductor's kernels and the backward's share are the GPU's to
    show: each runs to its verdict (a check that raised would be a FAIL line with no
    figure on the GPU machine), its control too."""
    module, _ = rehearsal
    o = getattr(module, check)(**kwargs)
    assert o.ok in (True, False) and o.control in (True, False), module.describe(o)
    assert o.figure.startswith(figure), o.figure


def test_vllm_is_skipped_without_cuda_and_its_goal_can_fail(rehearsal):
    module, _ = rehearsal
    o = module.check_vllm()
    assert o.ok is None and module.verdict(o) == "SKIP", o.figure
    steps = {"forward": [{"calls": 7}, {"calls": 2}],
             "graphs": [{"name": "piece0", "rows": [{"calls": 5}, {"calls": 4}]},
                        {"name": "piece1", "rows": [{"calls": 9}]}]}
    assert module.steps_served([steps])[0] is True
    assert module.steps_served([steps], extra=1)[0] is False
    steps["graphs"][1]["rows"][0]["calls"] = 8  # a row with a call removed
    assert module.steps_served([steps])[0] is False


def test_a_control_that_meets_the_goal_fails_the_check():
    module = load_script()
    assert module.verdict(module.Outcome(True, "x", control=False)) == "PASS"
    assert module.verdict(module.Outcome(True, "x", control=True)) == "FAIL"
    assert "control did not fail" in module.describe(module.Outcome(True, "x", True, "y"))
    assert module.verdict(module.Outcome(False, "x", control=False)) == "FAIL"
    assert module.verdict(module.Outcome(None, "x")) == "SKIP"


def test_the_timeouts_fit_a_lent_gpus_minutes():
    """Without vLLM (the GPU machine has none), the checks' timeouts and the install's add
    up to at most 6 minutes."""
    module = load_script()
    total = sum(c.timeout_s for name, c in module.CHECKS.items() if name != "vllm")
    assert total + 45 <= 360, total


def test_the_runner_kills_a_hung_check_and_reports_one_that_raises():
    module = load_script()
    t0 = time.monotonic()
    hung = module.run_child([sys.executable, "-c", "import time; time.sleep(60)"], 2)
    assert hung["verdict"] == "FAIL" and hung["line"].startswith("timed out after 2 s")
    assert time.monotonic() - t0 < 20
    raised = module.run_child([sys.executable, "-c", "raise RuntimeError('device hung')"], 30)
    assert raised["verdict"] == "FAIL" and "exited 1 without a result" in raised["line"]
    assert "RuntimeError: device hung" in raised["line"]
    result = {"verdict": "PASS", "line": "a figure"}
    said = module.run_child([sys.executable, "-c",
                             f"print('noise'); print({module.RESULT + json.dumps(result)!r})"], 30)
    assert said == result


def test_a_check_that_raises_is_a_fail_with_its_error(monkeypatch):
    """``--one``'s own wrapper: what the check raised is the line (the process exits
    normally, so the runner reads it)."""
    module = load_script()

    def broken():
        raise ValueError("no such event")

    monkeypatch.setitem(module.CHECKS, "events", module.Check(broken, 1))
    assert module.run_here("events") == {"verdict": "FAIL",
                                         "line": "failed: ValueError: no such event"}
