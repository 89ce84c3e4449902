"""``fxflops peak``: the table's peak for this device and what a matmul and a copy achieve."""

from __future__ import annotations

import argparse
import time

from fxflops.cli.args import positive_int


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("peak", help="measure achievable matmul TFLOP/s and copy GB/s here")
    p.add_argument("--n", type=positive_int, default=0,
                   help="matmul size (default: 8192 GPU, 1024 CPU)")
    p.add_argument("--dtype", default=None, choices=("bf16", "fp16", "fp32"),
                   help="default: bf16 on a GPU, fp32 on a CPU")
    p.add_argument("--measure", action="store_true",
                   help="measure a GEMM per dtype and a copy, and keep them as this device's "
                   "peak (source 'measured': MFU and rooflines where no table knows it)")
    p.set_defaults(func=run)


def measure(device: str, dtype_name: str, n: int, iters: int = 20) -> tuple[float, float]:
    """(matmul TFLOP/s, memory GB/s): best of ``iters`` timed runs after a warm-up; on a
    CPU the memory figure is the one its derived peak measures (``cpu_bandwidth``: a copy
    and a triad over arrays past the cache), on a GPU a 64 MiB copy."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(iters):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return min(times)

    mm_s = best(lambda: torch.mm(a, b))
    if device != "cuda":
        from fxflops.peaks.cpu_bandwidth import measure as measure_bandwidth

        return 2 * n**3 / mm_s / 1e12, measure_bandwidth().gbps
    src = torch.empty(64 << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_s = best(lambda: dst.copy_(src))
    # a copy reads and writes every byte
    return 2 * n**3 / mm_s / 1e12, 2 * src.numel() / copy_s / 1e9


def run(args: argparse.Namespace) -> int:
    import torch

    from fxflops.peaks.devices import current_peak, device_name

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = args.dtype or ("bf16" if cuda else "fp32")
    n = args.n or (8192 if cuda else 1024)
    if args.measure:
        return _measure_and_keep(device, n)
    name = device_name(device)  # as the reports name it: their peak (measured ones too)
    table = current_peak(name, dtype)
    tflops, gbps = measure(device, dtype, n)
    print(f"device: {name}  dtype: {dtype}  matmul {n}x{n}")
    print(f"table peak:   {_figure(table['tflops'])} TFLOP/s  {_figure(table['gbps'])} GB/s  "
          f"[{table['source']}]")
    print(f"measured:     {tflops:.3g} TFLOP/s  {gbps:.4g} GB/s")
    if table["tflops"]:
        print(f"matmul MFU of the table peak: {tflops / table['tflops']:.1%}")
        if tflops > table["tflops"]:
            # a derived peak is only as high as the clock the machine admits to (a VM's
            # current clock, not the turbo it runs its cores at)
            print("the table peak is below what this matmul reached: "
                  "`fxflops peak --measure` keeps the measured one for this device")
    print(f"use: FXFLOPS_PEAK_TFLOPS={tflops:.3g} FXFLOPS_PEAK_GBPS={gbps:.4g}")
    return 0


def _figure(value: float | None) -> str:
    return f"{value:.4g}" if value else "-"


def _measure_and_keep(device: str, n: int) -> int:
    """``--measure``: a GEMM per dtype and a copy; kept for this device (``peaks``)."""
    from fxflops.peaks.devices import device_name, match_device, save_measured

    name = device_name(device)
    dtypes = ("bf16", "fp16", "fp32") if device == "cuda" else ("fp32", "bf16")
    tflops: dict[str, float] = {}
    gbps = 0.0
    for dtype in dtypes:
        tflops[dtype], copy = measure(device, dtype, n)
        gbps = max(gbps, copy)
    path = save_measured(name, tflops, gbps)
    table = match_device(name)
    print(f"device: {name}  matmul {n}x{n}  (kept in {path})")
    for dtype, value in tflops.items():
        datasheet = table.tflops_for(dtype) if table is not None else None
        side = f"   datasheet {datasheet} TFLOP/s ({value / datasheet:.0%} attained)" \
            if datasheet else ""
        print(f"  {dtype}: measured {value:.3f} TFLOP/s{side}")
    side = f"   datasheet {table.gbps} GB/s" if table is not None and table.gbps else ""
    print(f"  copy: measured {gbps:.1f} GB/s{side}")
    if table is None:
        print("this device's peak is now the measured one (source 'measured') for every "
              "fxflops run on this host: MFU and rooflines use it")
    return 0
