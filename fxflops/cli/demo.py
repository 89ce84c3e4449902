"""``fxflops demo``: compile the built-in decoder with ``backend="fxflops"`` and show the figures."""

from __future__ import annotations

import argparse
import os
import time

from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from fxflops import config
from fxflops.cli.args import positive_int
from fxflops.cli.tables import fmt_bytes, fmt_num, fmt_pct, make_console

DECODE = [(2, 1), (4, 1), (8, 1), (16, 1)]
PREFILL = [(2, 16), (2, 32), (2, 64), (2, 128)]


def inner_backend(name: str) -> str:
    from fxflops import torch_compat

    known = set(torch_compat.get("list_backends")(exclude_tags=())) - {"fxflops"}
    if name not in known:
        raise argparse.ArgumentTypeError(
            f"unknown backend {name!r} (one of: {', '.join(sorted(known))})")
    return name


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the built-in Llama-style decoder under backend='fxflops'")
    p.add_argument("--inner", default="inductor", type=inner_backend,
                   help="inner backend: inductor, eager, aot_eager, or any registered name")
    p.add_argument("--iters", type=positive_int, default=20, help="calls per size")
    # a run's reports go to $FXFLOPS_OUT wherever fxflops runs: the demo too
    p.add_argument("--out", default=config.OUT.get() or "fxflops-out",
                   help="folder for the report and graph dumps (default: $FXFLOPS_OUT if "
                        "set, else fxflops-out)")
    p.add_argument("--layers", type=positive_int, default=2, help="decoder layers")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from fxflops.cli.demo_model import DemoConfig, DemoDecoder, sdpa_flops
    from fxflops.cost.formulas.aten import torch_lacks
    from fxflops.instrument.backend import backend
    from fxflops.outputs.session import session

    console = make_console()
    os.environ[config.OUT.name] = args.out  # this run's report and dumps go there
    torch.manual_seed(0)
    cfg = DemoConfig(layers=args.layers)
    model = DemoDecoder(cfg).eval()
    compiled = torch.compile(model, backend=backend(inner=args.inner), dynamic=True)
    sizes = DECODE + PREFILL
    console.print(f"[bold]fxflops demo[/]: {cfg.layers}-layer decoder, hidden {cfg.hidden}, "
                  f"GQA {cfg.heads}/{cfg.kv_heads} heads, inner backend {args.inner!r}; "
                  f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    expected: dict[tuple[int, tuple[int, ...]], int] = {}  # (graph, size key) -> FlopCounterMode count
    # CPU SDPA: what FlopCounterMode counts 0 where this torch's registry lacks it (< 2.15)
    sdpa_missed = "aten::_scaled_dot_product_flash_attention_for_cpu" in torch_lacks()
    rec = session()
    start = time.perf_counter()
    with torch.inference_mode(), Progress(console=console, transient=True) as progress:
        task = progress.add_task("compiling and running", total=len(sizes) * args.iters)
        for b, s in sizes:
            x = torch.randint(0, cfg.vocab, (b, s))
            with FlopCounterMode(display=False) as counter:
                model(x)
            before = _counts(rec)
            for _ in range(args.iters):
                compiled(x)
                progress.advance(task)
            # the row this input landed in is the one whose count moved
            for where, n in _counts(rec).items():
                if n != before.get(where, 0):
                    expected[where] = counter.get_total_flops() + \
                        (sdpa_flops(cfg, b, s) if sdpa_missed else 0)
    elapsed = time.perf_counter() - start

    peak = rec.to_dict()["peak"]
    table = Table(title="per graph and size (median of the calls)")
    for col in ("graph", "size", "calls", "median ms", "GFLOPs", "matmul GFLOPs", "GFLOP/s",
                "MFU", "bytes (I/O)", "FLOP/byte", "FlopCounterMode"):
        table.add_column(col, justify="left" if col == "graph" else "right")
    ok = True
    for row in rec.stats():
        where = (row["graph_id"], tuple(row["key"]))
        check = ""
        if where in expected:
            match = expected[where] == row["matmul_flops"]
            ok &= match
            check = "[green]= exact[/]" if match else f"[red]{fmt_num(expected[where])}[/]"
        table.add_row(row["graph"], str(row["size"]), str(row["calls"]),
                      f"{row['median_ms']:.3f}", fmt_num(row["flops"] / 1e9),
                      fmt_num(row["matmul_flops"] / 1e9),
                      fmt_num((row["tflops"] or 0) * 1e3), fmt_pct(row["mfu"]),
                      fmt_bytes(row["bytes_io"]),
                      fmt_num(row["intensity"] or 0), check)
    console.print(table)
    console.print(escape(f"MFU against a peak of {peak.get('tflops') or 0:.3f} TFLOP/s "
                         f"[{peak.get('source')}] (fxflops peak --measure measures it)"))

    # the graph with the most size symbols (prefill: batch and sequence) shows the most
    first = max(rec.graphs, key=lambda g: (len(g.cost.symbols), len(g.rows)))
    mods = Table(title=f"top modules by FLOPs ({first.name}, symbolic)")
    mods.add_column("module")
    mods.add_column("FLOPs")
    mods.add_column("matmul")
    for name, r in list(first.cost.by_module(depth=3).items())[:8]:
        mods.add_row(name, str(r.flops), str(r.matmul_flops))
    console.print(mods)
    # what the formulas' symbols are (the first table's size AxB: their values, in order)
    if first.cost.symbol_sources:
        console.print(escape(f"size symbols of {first.name}: "
                             + ", ".join(map(str, first.cost.symbol_sources))))
    rec.flush()  # this run's one report under --out, and the per-size graph dumps
    path = rec.default_path()
    # (one sentence on every torch: what is added is what this torch's registry misses)
    console.print("FlopCounterMode column: torch's count of the same model run eagerly, plus "
                  "the matmul FLOPs of ops its registry misses (CPU SDPA, before torch 2.15)."
                  f" {'All match.' if ok else 'MISMATCH'}")
    console.print(escape(f"report: {path}  graphs: {os.path.join(args.out, 'graphs')}/  "
                         f"({elapsed:.1f} s, compile included)"))
    console.print(f"next: fxflops report {args.out}")
    return 0 if ok else 1


def _counts(rec) -> dict[tuple[int, tuple[int, ...]], int]:
    return {(g.id, r.key): r.count for g in rec.graphs for r in g.rows.values()}
