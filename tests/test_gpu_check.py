"""scripts/gpu_check.py rehearsed on a CPU: each check's own code (its models, the fxflops
calls it makes, the report keys it reads) run small, with the CUDA simulator
(tests/cuda_sim.py) standing in for ``torch.cuda``, so that a check that would raise on the
GPU machine is found here, before a GPU is lent (one session's few minutes on it).

What a rehearsal cannot say is whether a check meets its goal: tensors are on the CPU,
so fxflops times them by the CPU clock, and the simulator's events time nothing. Only that
each check runs to its verdict is asserted, and, where the CPU shows it too, the figure it
prints."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.cuda_sim import CudaSim

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


@pytest.fixture()
def gpu_check(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check_rehearsed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "DEVICE", "cpu")
    monkeypatch.setattr(module, "SHRINK", 64)
    # the simulator for the checks' own torch.cuda calls, but torch itself still sees no
    # CUDA (Inductor would look for Triton on a device): the checks' graphs are CPU graphs
    CudaSim(lag=2, devices=1).install(monkeypatch, leave=("is_available", "device_count"))
    # check 3 points FXFLOPS_OUT at a folder of its own: put back afterwards
    monkeypatch.setenv("FXFLOPS_OUT", str(tmp_path))
    return module


@pytest.mark.parametrize("check,args,figure", [
    ("check_event_agreement", (20,), "median per call: fxflops"),
    ("check_overhead", (20,), "batch-1 forward: bare"),
    ("check_calls_in_flight", (20,), "20 calls made"),
    ("check_cuda_graph_replays", (4,), "CUDA graphs: 4 replays"),
    ("check_training", (5,), "training: backward graph"),
    ("check_peak", (), "NVIDIA H200 (simulated): bf16 matmul"),
    ("check_kernels", (3,), "kernels: "),
])
def test_each_check_runs_to_its_verdict(gpu_check, check, args, figure):
    """Run as ``main`` runs it, less its catch: a check that raised would be a FAIL line
    with no figure on the GPU machine."""
    ok, line = getattr(gpu_check, check)(*args)
    assert ok in (True, False) and line.startswith(figure), line


def test_the_rehearsal_checks_what_the_gpu_run_reads(gpu_check):
    """Where the CPU shows what the GPU run would: the overhead check calls both graphs with
    the inputs Dynamo gives them (the parameters among them), and the CUDA-graph check
    finds its two models' graphs by name, the warm-up calls in the warm-up rows."""
    import fxflops

    ok, line = gpu_check.check_overhead(10)
    bare_us = float(line.split("bare ")[1].split(" us")[0])
    assert bare_us > 0
    gpu_check.check_cuda_graph_replays(2)
    names = [g["name"] for g in fxflops.recorder().to_dict()["graphs"]]
    assert {"A", "B"} <= set(names), names
