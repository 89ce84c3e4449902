"""All GPU checks of fxflops in one command (goal: under 5 minutes on one H200).

    python scripts/gpu_check.py [--quick]

Prints, each with its goal:
  1. fxflops' per-call times against hand-placed CUDA events around the same calls (2%);
  2. the overhead per call at a small decode-like size (under 1% of the forward);
  3. per-graph times recorded for CUDA-graph replays (one sample per replay);
  4. measured bf16 matmul TFLOP/s and copy GB/s, and MFU against the device table;
  5. a tiny vLLM mode-3 run with FXFLOPS=1, if vLLM with CUDA is importable.
Without a GPU it says so and exits 0 (nothing to check here).
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


def mlp(hidden: int, layers: int):
    import torch

    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(hidden, 4 * hidden, bias=False), torch.nn.GELU(),
                   torch.nn.Linear(4 * hidden, hidden, bias=False)]
    return torch.nn.Sequential(*blocks).cuda().to(torch.bfloat16).eval()


def compiled_pair(model, example):
    """(instrumented, bare) compiled callables of the same graph, Inductor inside both."""
    import torch

    import fxflops

    captured = {}
    fx = fxflops.backend(inner="inductor")

    def capture(gm, example_inputs):
        captured["ours"] = fx(gm, example_inputs)
        return captured["ours"]

    compiled = torch.compile(model, backend=capture)
    with torch.no_grad():
        compiled(example)
    return compiled, captured["ours"]


def check_event_agreement(iters: int) -> None:
    import torch

    import fxflops

    model = mlp(4096, 4)
    x = torch.randn(256, 4096, device="cuda", dtype=torch.bfloat16)
    compiled, ours = compiled_pair(model, x)
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
    ours._timer.harvest()
    (row,) = graph.rows.values()
    hand_ms = statistics.median(s.elapsed_time(e) for s, e in hand)
    ours_ms = row.percentiles()["median_ms"]
    print(f"[1] median per call: fxflops {ours_ms:.4f} ms, hand events {hand_ms:.4f} ms, "
          f"difference {100 * (ours_ms - hand_ms) / hand_ms:+.2f}% (goal: within 2%); "
          f"{row.count}/{iters} samples harvested, {ours._timer.dropped} dropped")


def check_overhead(iters: int) -> None:
    import torch

    model = mlp(4096, 4)
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    compiled, ours = compiled_pair(model, x)
    bare = ours.inner

    def wall(fn, n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn(x)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n

    with torch.no_grad():
        rounds = [(wall(bare, iters), wall(ours, iters)) for _ in range(5)]
    b = min(r[0] for r in rounds)
    o = min(r[1] for r in rounds)
    print(f"[2] batch-1 forward: bare {b * 1e6:.1f} us, instrumented {o * 1e6:.1f} us, "
          f"overhead {(o - b) * 1e6:.2f} us = {100 * (o - b) / b:.2f}% (goal: under 1%)")


def check_cuda_graph_replays(replays: int) -> None:
    import torch

    import fxflops
    from fxflops.timing import capture_registry

    model = mlp(2048, 2)
    x = torch.randn(8, 2048, device="cuda", dtype=torch.bfloat16)
    compiled, ours = compiled_pair(model, x)
    graph_record = fxflops.recorder().graphs[-1]
    graph_record.rows.clear()
    with torch.no_grad():
        for _ in range(3):  # warm up on a side stream, as CUDA-graph capture requires
            compiled(x)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            compiled(x)
        for _ in range(replays):
            g.replay()
    torch.cuda.synchronize()
    capture_registry().flush()
    rows = list(graph_record.rows.values())
    samples = sum(r.count for r in rows)
    med = rows[0].percentiles()["median_ms"] if rows else float("nan")
    print(f"[3] CUDA-graph replays: {replays} replays, {samples} per-graph samples recorded "
          f"(median {med:.4f} ms; {capture_registry().missed} missed)")


def check_peak() -> None:
    import torch

    from fxflops.cli.peak import measure
    from fxflops.peaks import current_peak

    name = torch.cuda.get_device_name()
    table = current_peak(name, "bf16")
    tflops, gbps = measure("cuda", "bf16", 8192)
    mfu = f"{tflops / table['tflops']:.1%}" if table["tflops"] else "-"
    print(f"[4] {name}: bf16 matmul {tflops:.1f} TFLOP/s (table {table['tflops']}, MFU {mfu}), "
          f"copy {gbps:.0f} GB/s (table {table['gbps']})")


def check_vllm() -> None:
    try:
        import torch
        import vllm  # noqa: F401

        if not torch.cuda.is_available():
            raise ImportError("no CUDA")
    except ImportError as e:
        print(f"[5] vLLM mode 3: skipped (vLLM with CUDA not importable: {e})")
        return
    out = Path(tempfile.mkdtemp(prefix="fxflops-vllm-"))
    cmd = [sys.executable, str(ROOT / "examples" / "vllm_tiny.py"), str(out), "--mode", "3",
           "--backend", "inductor"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "FXFLOPS": "1"})
    if proc.returncode != 0:
        print(f"[5] vLLM mode 3: FAILED\n{proc.stderr[-2000:]}")
        return
    report = subprocess.run([sys.executable, "-m", "fxflops.cli.main", "report", str(out)],
                            capture_output=True, text=True)
    print("[5] vLLM mode 3 (FXFLOPS=1):\n" + report.stdout)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="fewer iterations")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing to check")
        return 0
    n = 50 if args.quick else 200
    start = time.perf_counter()
    for check in (lambda: check_event_agreement(n), lambda: check_overhead(n),
                  lambda: check_cuda_graph_replays(n), check_peak, check_vllm):
        try:
            check()
        except Exception as e:  # one failed check must not hide the others' figures
            print(f"check failed: {type(e).__name__}: {e}")
    print(f"gpu_check: done in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
