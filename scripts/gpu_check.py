"""All GPU checks of fxflops in one command (goal: under 5 minutes on one H200).

    python scripts/gpu_check.py [--quick]

Prints one line per check, with its figure and its goal, and PASS or FAIL:
  1. fxflops' per-call times against hand-placed CUDA events around the same calls (2%);
  2. the overhead per call at a small decode-like size (under 1% of the forward);
  3. calls in the report equal calls made with work still in flight, and after a flush
     every call is timed (or counted lost);
  4. the CUDA-graph lifecycle vLLM drives, on plain torch.compile: warm-up calls, captures
     (one graph, and two in one), replays with the host ahead, and reduce-overhead: every
     replay counted where it is served, timed;
  5. a compiled training step: the backward graph timed by CUDA events (within the whole
     backward's time measured around ``loss.backward()``);
  6. measured bf16 matmul TFLOP/s and copy GB/s against the device table (at least 50%);
  7. a tiny vLLM mode-3 run with FXFLOPS=1 whose report has rows, device and dtype (if vLLM
     with CUDA is importable; else SKIP);
  8. kernels: an MLP compiled with ``kernels=N``: its Triton kernels and extern GEMMs mapped
     (per-kernel FLOPs adding up to the row's exactly) and timed from Kineto's device events
     (every kernel a time; their sum within the call's).
It first installs fxflops with ``pip install --no-deps -e .`` (the machine's torch stays).
tests/test_gpu_check.py rehearses every check on a CPU (small, the CUDA simulator as
``torch.cuda``), so that one that would raise is found before a GPU is lent.
Exit status: 0 when every check met its goal, 1 when any missed it or failed, 2 without a
GPU (nothing was checked).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# where the checks run, and by how much their sizes shrink: "cuda" and 1 here; a rehearsal
# on a CPU (tests/test_gpu_check.py, with the CUDA simulator as torch.cuda) runs each
# check's code small, so that a check that would raise is found before a GPU is lent
DEVICE = "cuda"
SHRINK = 1


def shrunk(size: int) -> int:
    """A size of a check, shrunk for a rehearsal."""
    return max(8, size // SHRINK)


def mlp(hidden: int, layers: int):
    import torch

    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(hidden, 4 * hidden, bias=False), torch.nn.GELU(),
                   torch.nn.Linear(4 * hidden, hidden, bias=False)]
    return torch.nn.Sequential(*blocks).to(DEVICE, torch.bfloat16).eval()


def compiled_pair(model, example):
    """The model compiled through fxflops (Inductor inside), fxflops' graph object, and the
    graph's inputs as Dynamo passes them (the parameters are inputs too, not all first: a
    graph is called with all of them, ``graph(*inputs)``). Each check starts from a fresh
    Dynamo, so that the checks' compiles of one ``Sequential.forward`` never reach
    Dynamo's recompile limit (past it, a model runs eager, uninstrumented)."""
    import torch

    import fxflops

    torch._dynamo.reset()
    captured = {}
    fx = fxflops.backend(inner="inductor")

    def capture(gm, example_inputs):
        captured["inputs"] = list(example_inputs)
        captured["ours"] = fx(gm, example_inputs)
        return captured["ours"]

    compiled = torch.compile(model, backend=capture)
    with torch.no_grad():
        compiled(example)
    return compiled, captured["ours"], captured["inputs"]


def check_event_agreement(iters: int) -> tuple[bool, str]:
    import torch

    import fxflops

    model = mlp(shrunk(4096), 4)
    x = torch.randn(shrunk(256), shrunk(4096), device=DEVICE, dtype=torch.bfloat16)
    compiled, _, _ = compiled_pair(model, x)
    rec = fxflops.recorder()
    graph = rec.graphs[-1]
    graph.rows.clear()
    hand = []
    with torch.no_grad():
        for _ in range(iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            compiled(x)
            e.record()
            hand.append((s, e))
    torch.cuda.synchronize()
    from fxflops.recording import cuda_events

    cuda_events.collect_all(wait_s=5.0)
    (row,) = graph.rows.values()
    hand_ms = statistics.median(s.elapsed_time(e) for s, e in hand)
    ours_ms = row.percentiles()["median_ms"]
    diff = (ours_ms - hand_ms) / hand_ms if hand_ms else float("inf")
    return abs(diff) <= 0.02 and row.samples_taken == iters, (
        f"median per call: fxflops {ours_ms:.4f} ms, hand events {hand_ms:.4f} ms, "
        f"difference {100 * diff:+.2f}% (goal: within 2%, every call timed); "
        f"{row.samples_taken}/{iters} samples read, {row.lost} lost")


def check_calls_in_flight(iters: int) -> tuple[bool, str]:
    """Calls in the report equal calls made, with work still in flight when it is written;
    a flush (which waits, on its own thread) then has every call timed."""
    import torch

    import fxflops
    from fxflops.report.files import load_reports

    # about 6 ms a call on an H200 (4.4 TFLOP): the queue still holds work when the report
    # is made, and drains within the flush's wait (recording/collection.py's DEVICE_WAIT_S)
    model = mlp(shrunk(4096), 4)
    x = torch.randn(shrunk(4096), shrunk(4096), device=DEVICE, dtype=torch.bfloat16)
    compiled, _, _ = compiled_pair(model, x)
    graph = fxflops.recorder().graphs[-1]
    torch.cuda.synchronize()
    graph.rows.clear()
    with torch.no_grad():
        for _ in range(iters):
            compiled(x)
    in_flight = not torch.cuda.current_stream().query()
    (row,) = fxflops.recorder().to_dict()["graphs"][-1]["rows"]
    calls_now = row["calls"]
    os.environ["FXFLOPS_OUT"] = tempfile.mkdtemp(prefix="fxflops-gpu-check-")
    fxflops.recorder().flush()
    (report,) = load_reports([os.environ["FXFLOPS_OUT"]])
    (flushed,) = [g for g in report["graphs"] if g["name"] == graph.name][0]["rows"]
    ok = calls_now == iters and flushed["calls"] == iters and \
        flushed["timed_calls"] + flushed["lost_samples"] == iters
    return ok, (f"{iters} calls made, work in flight at the report: {in_flight}; report "
                f"then: {calls_now} calls; after a flush: {flushed['calls']} calls, "
                f"{flushed['timed_calls']} timed, {flushed['lost_samples']} lost (goal: every "
                "call counted, every call timed or counted lost)")


def check_overhead(iters: int) -> tuple[bool, str]:
    import torch

    model = mlp(shrunk(4096), 4)
    x = torch.randn(1, shrunk(4096), device=DEVICE, dtype=torch.bfloat16)
    _, ours, inputs = compiled_pair(model, x)
    bare = ours.inner

    def wall(fn, n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*inputs)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n

    with torch.no_grad():
        rounds = [(wall(bare, iters), wall(ours, iters)) for _ in range(5)]
    b = min(r[0] for r in rounds)
    o = min(r[1] for r in rounds)
    share = (o - b) / b
    return share < 0.01, (f"batch-1 forward: bare {b * 1e6:.1f} us, instrumented "
                           f"{o * 1e6:.1f} us, overhead {(o - b) * 1e6:.2f} us = "
                           f"{100 * share:.2f}% (goal: under 1%)")


def check_cuda_graph_replays(replays: int) -> tuple[bool, str]:
    """The lifecycle vLLM drives, on plain torch.compile: eager warm-up calls (a warm-up
    phase), a capture (the capture phase) of one compiled graph, and of two in one graph
    (a FULL graph's shape), then ``replays`` replays each with the host running ahead (no
    sync between them); and ``mode="reduce-overhead"`` (Inductor's CUDA-graph trees inside
    fxflops' wrapper). Goal: every replay counted in the serving rows (none in warm-up
    rows); piecewise replays all timed after a sync; FULL-graph rows timed + lost = calls;
    reduce-overhead calls all counted and timed, outputs identical to the bare backend."""
    import torch

    import fxflops
    from fxflops.recording import cuda_events
    from fxflops.recording.phases import warmup

    fxflops.reset_recorder()
    torch._dynamo.reset()
    model_a, model_b = mlp(shrunk(2048), 1), mlp(shrunk(2048), 1)
    x = torch.randn(8, shrunk(2048), device=DEVICE, dtype=torch.bfloat16)
    # a backend each: one backend for both would give both one graph (their forward is
    # one code object, the parameters its inputs), and A's rows would hold B's calls
    a = torch.compile(model_a, backend=fxflops.backend(name="A"))
    b = torch.compile(model_b, backend=fxflops.backend(name="B"))
    side = torch.cuda.Stream()
    with torch.no_grad():
        with warmup("warmup"), torch.cuda.stream(side):
            for _ in range(3):
                a(x), b(x)
        torch.cuda.synchronize()
        one, two = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with warmup("capture"):
            with torch.cuda.graph(one):
                a(x)
            with torch.cuda.graph(two):
                b(a(x))
        t0 = time.perf_counter()
        for _ in range(replays):  # the host runs ahead: nothing waits
            one.replay()
            two.replay()
        host_s = time.perf_counter() - t0
        torch.cuda.synchronize()
    report = fxflops.recorder().to_dict()
    cuda_events.collect_all(wait_s=5.0, final=True)
    report = fxflops.recorder().to_dict()
    graphs = {g["name"]: g for g in report["graphs"]}
    ga, gb = graphs["A"], graphs["B"]
    # A runs in both graphs: its replays in graph one (A alone) are all timed; in graph
    # two (A and B), per-call times are read when the previous replay has finished
    a_calls = sum(r["calls"] for r in ga["rows"])
    a_timed = sum(r["timed_calls"] for r in ga["rows"])
    a_lost = sum(r["lost_samples"] for r in ga["rows"])
    b_rows = gb["rows"]
    b_calls = sum(r["calls"] for r in b_rows)
    b_ok = all(r["timed_calls"] + r["lost_samples"] == r["calls"] for r in b_rows)
    # the warm-up calls in the warm-up rows, 3 each; a call made while capturing runs
    # nothing and is counted nowhere (the report leaves out rows without calls)
    warm_ok = all(sorted((r["warmup"], r["calls"]) for r in g.get("warmup", []))
                  == [("warmup", 3)] for g in (ga, gb))
    ok = a_calls == 2 * replays and a_timed >= replays and a_timed + a_lost == a_calls \
        and b_calls == replays and b_ok and warm_ok
    line = (f"CUDA graphs: {replays} replays of a 1-call and a 2-call graph: graph A {a_calls} "
            f"calls ({a_timed} timed), graph B {b_calls} calls; warm-up rows warm-up only: "
            f"{warm_ok}; host {1e6 * host_s / (2 * replays):.1f} us per replay")
    # reduce-overhead: Inductor's CUDA-graph trees inside fxflops' wrapper
    torch._dynamo.reset()
    ro = torch.compile(mlp(shrunk(2048), 1), backend=fxflops.backend(inner="inductor"),
                       mode="reduce-overhead")
    bare = torch.compile(ro._orig_mod, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(5):
            same = torch.equal(ro(x).clone(), bare(x).clone())
        for _ in range(replays):
            ro(x)
        torch.cuda.synchronize()
    ro_report = fxflops.recorder().to_dict()
    ro_rows = ro_report["graphs"][-1]["rows"]
    ro_calls = sum(r["calls"] for r in ro_rows)
    ro_timed = sum(r["timed_calls"] for r in ro_rows)
    ok = ok and same and ro_calls == replays + 5 and ro_timed == ro_calls
    return ok, line + (f"; reduce-overhead: {ro_calls} calls, {ro_timed} timed, outputs "
                       f"identical: {same} (goal: every replay counted where served)")


def check_training(steps: int) -> tuple[bool, str]:
    """A compiled training step: the backward graph timed by CUDA events like the forward,
    its median within 10% of hand-placed events around ``loss.backward()``."""
    import torch

    import fxflops

    torch._dynamo.reset()
    wide, narrow = shrunk(8192), shrunk(2048)
    model = torch.nn.Sequential(torch.nn.Linear(narrow, wide), torch.nn.GELU(),
                                torch.nn.Linear(wide, narrow)).to(DEVICE, torch.bfloat16)
    compiled = torch.compile(model, backend="fxflops")
    x = torch.randn(shrunk(256), shrunk(2048), device=DEVICE, dtype=torch.bfloat16)
    for _ in range(3):
        compiled(x).float().pow(2).mean().backward()
    torch.cuda.synchronize()
    backward = [g for g in fxflops.recorder().graphs if g.meta.get("phase") == "backward"]
    if not backward:
        return False, "training: no backward graph was instrumented"
    backward[-1].rows.clear()
    hand = []
    for _ in range(steps):
        loss = compiled(x).float().pow(2).mean()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss.backward()
        end.record()
        hand.append((start, end))
    torch.cuda.synchronize()
    hand_ms = statistics.median(s.elapsed_time(e) for s, e in hand)
    compiled(x)  # a later call harvests the last pending events
    torch.cuda.synchronize()
    rows = list(backward[-1].rows.values())
    timer = rows[0] if rows else None
    ours_ms = timer.percentiles()["median_ms"] if timer else float("nan")
    calls = sum(r.count for r in rows)
    ok = calls >= steps - 2 and 0 < ours_ms <= hand_ms * 1.1
    return ok, (f"training: backward graph {calls}/{steps} calls timed, median {ours_ms:.3f} ms "
                f"vs {hand_ms:.3f} ms around loss.backward() (goal: timed, at most the whole "
                "backward + 10%)")


def check_peak() -> tuple[bool, str]:
    import torch

    from fxflops.cli.peak import measure
    from fxflops.report.peaks import current_peak

    name = torch.cuda.get_device_name()
    table = current_peak(name, "bf16")
    tflops, gbps = measure(DEVICE, "bf16", shrunk(8192))
    if not table["tflops"] or not table["gbps"]:
        return False, f"{name}: not in the device table (bf16 {tflops:.1f} TFLOP/s measured)"
    mfu, bw = tflops / table["tflops"], gbps / table["gbps"]
    return mfu >= 0.5 and bw >= 0.5, (
        f"{name}: bf16 matmul {tflops:.1f} TFLOP/s = {mfu:.1%} of the table's "
        f"{table['tflops']}, copy {gbps:.0f} GB/s = {bw:.1%} of {table['gbps']} (goal: the "
        "table's peaks within reach, at least 50% each)")


def check_vllm() -> tuple[bool | None, str]:
    try:
        import torch
        import vllm  # noqa: F401

        if not torch.cuda.is_available():
            raise ImportError("no CUDA")
    except Exception as e:  # vLLM absent, or present and broken here: not this check's goal
        return None, f"vLLM mode 3: not run (vLLM with CUDA not importable: {e})"
    out = Path(tempfile.mkdtemp(prefix="fxflops-vllm-"))
    cmd = [sys.executable, str(ROOT / "examples" / "vllm_tiny.py"), str(out), "--mode", "3",
           "--backend", "inductor"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "FXFLOPS": "1"})
    if proc.returncode != 0:
        return False, f"vLLM mode 3: the run failed: {proc.stderr[-1500:]}"
    from fxflops.report.files import load_reports

    reports = load_reports([out])
    rows = [r for rep in reports for g in rep["graphs"] for r in g["rows"]]
    proc_info = reports[0]["process"]
    pieces = sum(len(rep["graphs"]) for rep in reports)
    ok = bool(rows) and proc_info.get("device") and proc_info.get("dtype")
    return bool(ok), (f"vLLM mode 3 (FXFLOPS=1): {pieces} graphs, {len(rows)} rows, device "
                      f"{proc_info.get('device')}, dtype {proc_info.get('dtype')} (goal: rows, "
                      "device and dtype)")


def check_kernels(calls: int) -> tuple[bool, str]:
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
    torch.cuda.synchronize()
    report = fxflops.recorder().to_dict()
    (graph,) = report["graphs"]
    (row,) = graph["rows"]
    kernels = row.get("kernels") or []
    prof = row.get("kernels_profile") or {}
    names = [k["kernel"] for k in kernels]
    triton = [n for n in names if n.startswith("triton_")]
    timed = [k for k in kernels if k.get("median_ms")]
    exact = sum(k["flops"] for k in kernels) == row["flops"]
    within = prof.get("kernels_ms", 1e9) <= prof.get("median_ms", 0)
    ok = bool(triton) and exact and len(timed) == len(kernels) and within
    return ok, (f"kernels: {len(kernels)} mapped ({len(triton)} Triton), {len(timed)} timed "
                f"over {prof.get('calls')} calls, FLOPs exact: {exact}, in kernels "
                f"{prof.get('kernels_ms', 0):.3f} of {prof.get('median_ms', 0):.3f} ms  "
                "goal: Triton kernels mapped, every kernel timed, within the call")


def install_without_deps() -> None:
    """fxflops as users install it (its entry points: backend="fxflops", the vLLM plugin),
    on the machine's own torch: nothing is fetched (--no-deps: the GPU machine has no
    network, and its torch must stay)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--no-build-isolation", "-e", str(ROOT)], capture_output=True,
                          text=True, timeout=180)
    if proc.returncode != 0:
        # (a Python 3.12 environment may lack setuptools, which --no-build-isolation needs)
        print("gpu_check: could not install fxflops (--no-deps); running from the source "
              "tree, backend=\"fxflops\" registered here: "
              + (proc.stderr.strip().splitlines() or ["?"])[-1], flush=True)
        import torch

        from fxflops.instrument.entry_points import fxflops_backend

        if "fxflops" not in torch._dynamo.list_backends(exclude_tags=()):
            torch._dynamo.register_backend(compiler_fn=fxflops_backend, name="fxflops")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="fewer iterations")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing was checked")
        return 2
    n = 50 if args.quick else 200
    start = time.perf_counter()
    install_without_deps()
    checks = [lambda: check_event_agreement(n), lambda: check_overhead(n),
              lambda: check_calls_in_flight(n), lambda: check_cuda_graph_replays(n),
              lambda: check_training(n // 4), check_peak, check_vllm,
              lambda: check_kernels(5)]
    missed = 0
    for i, check in enumerate(checks, 1):
        try:
            ok, line = check()
        except Exception as e:  # one failed check must not hide the others' figures
            ok, line = False, f"failed: {type(e).__name__}: {e}"
        verdict = "SKIP" if ok is None else "PASS" if ok else "FAIL"
        missed += ok is False
        print(f"[{i}] {verdict} {line}", flush=True)
    print(f"gpu_check: {len(checks) - missed}/{len(checks)} checks met their goal "
          f"in {time.perf_counter() - start:.0f} s")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
