"""Instructions per call through ``torch.compile``: bare, the floor, fxflops (callgrind).

    python benchmarks/overhead_instructions.py [--inner eager] [--grad] [--static] [--calls 1000]
                                               [--cache-sim]

Wall-clock figures of a microsecond drift with the machine (benchmarks/overhead.py); the
instructions a call executes do not. This runs itself under ``valgrind --tool=callgrind``
(about 7 minutes with eager inside, 9 with Inductor, one core: torch's import and the
compiles, instrumented), with a dump before each ``os.getloadavg()`` that separates the
loops, and prints each variant's instructions per call: ``bare`` (the inner backend),
``floor`` (a backend that only calls the inner), ``fxflops`` (past a size's first calls,
each timed: one in ``FXFLOPS_SAMPLE_EVERY`` timed) and ``timed``
(``FXFLOPS_SAMPLE_EVERY=1``: every call timed).
Grad mode is off unless ``--grad`` (then the weights need grad: AOTAutograd's forward).
Graphs are compiled with ``dynamic=True`` (the size key an int argument) unless
``--static`` (one size, the key ``()``).
Each variant runs twice, in turn, and the lower figure is kept; the collector is frozen
before the loops and string hashes are fixed (``PYTHONHASHSEED=0``).

``--cache-sim`` (about twice as long) also simulates the caches and the branch
predictors (callgrind's ``--cache-sim=yes --branch-sim=yes``) and prints, per call over
bare, the instruction-cache and data-cache misses and the mispredicted conditional and
indirect branches. In place, after the model's own call has filled the caches and the
predictors with its own code, these are what an added bytecode costs more than its
instructions: each of the interpreter's dispatches is an indirect branch, and each C
path the bookkeeping takes that the model's call does not is code to fetch. Callgrind's
models are simple (a first-level cache, a last-level one, no history beyond each
branch's last target), so the counts say where the time goes, not how much of it.
"""

from __future__ import annotations

import argparse
import gc
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

# each twice, in turn; a variant's figure is its lower (the other holds a collection of
# the garbage the loops made, or a cache's growth)
VARIANTS = ("bare", "floor", "fxflops", "timed") * 2
# callgrind's events under --cache-sim: what is printed, and how
MISSES = (("I1 misses", ("I1mr",)), ("D1 misses", ("D1mr", "D1mw")),
          ("cond. mispredicts", ("Bcm",)), ("ind. mispredicts", ("Bim",)))


def measure(inner: str, grad: bool, static: bool, calls: int) -> None:
    """(Under callgrind.) The loops, one dump each."""
    import torch

    import fxflops

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from overhead import WARM_CALLS, floor_backend, sample_every

    class Small(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x) * 2 + 1

    torch.set_num_threads(1)
    backends = {"bare": inner, "floor": floor_backend(inner),
                "fxflops": fxflops.backend(inner=inner), "timed": fxflops.backend(inner=inner)}
    fns = {name: torch.compile(Small(), backend=b, dynamic=None if static else True)
           for name, b in backends.items()}
    x = torch.randn(8, 4)
    # grad on: the weights need grad, so Dynamo's graph goes through AOTAutograd and
    # fxflops times its forward graph (boxed)
    with torch.set_grad_enabled(grad):
        for name, fn in fns.items():
            # every call timed (read when the graph is made: at its first call)
            with sample_every("1" if name == "timed" else None):
                for _ in range(WARM_CALLS):  # past the calls every one of which fxflops times
                    fn(x)
        # what the import and the compiles left is out of the collector's way: a full
        # collection of it inside one loop would be that variant's cost
        gc.collect()
        gc.freeze()
        for name in VARIANTS:
            os.getloadavg()  # a dump: what ran since
            fn = fns[name]
            for _ in range(calls):
                fn(x)
        os.getloadavg()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--inner", default="eager")
    p.add_argument("--grad", action="store_true", help="grad mode on (default: off)")
    p.add_argument("--static", action="store_true",
                   help="static graphs, one size (default: dynamic=True)")
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--cache-sim", action="store_true",
                   help="also count cache misses and mispredicted branches (slower)")
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        measure(args.inner, args.grad, args.static, args.calls)
        return 0
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("overhead_instructions: valgrind is not installed", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "callgrind.out")
        # the interpreter itself (not a shell shim), so that valgrind follows it
        # string hashes fixed: a dict's probe sequence is then the same in every run
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        simulate = ["--cache-sim=yes", "--branch-sim=yes"] if args.cache_sim else []
        subprocess.run([valgrind, "--tool=callgrind", "--dump-before=os_getloadavg",
                        "--dump-instr=no", f"--callgrind-out-file={out}", *simulate,
                        os.path.realpath(sys.executable), os.path.abspath(__file__),
                        "--measure", "--inner", args.inner, "--calls", str(args.calls)]
                       + (["--grad"] if args.grad else [])
                       + (["--static"] if args.static else []),
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=3600, env=env)
        parts = sorted(glob.glob(out + ".*"), key=lambda f: int(f.rsplit(".", 1)[1]))
        counts = [_events(f) for f in parts]
    loops = counts[1:1 + len(VARIANTS)]  # the first part is the import and the compiles
    if len(loops) != len(VARIANTS):
        print(f"overhead_instructions: {len(parts)} dumps, expected {len(VARIANTS) + 1}",
              file=sys.stderr)
        return 1
    runs: dict[str, list[dict[str, int]]] = {}  # each variant's loops, in turn
    for name, events in zip(VARIANTS, loops):
        runs.setdefault(name, []).append(events)
    per_call = {name: [events["Ir"] / args.calls for events in loops_of]
                for name, loops_of in runs.items()}
    bare = min(per_call["bare"])
    print(f"instructions per call, inner {args.inner}, grad {'on' if args.grad else 'off'}, "
          f"{'static' if args.static else 'dynamic'} (callgrind, {args.calls:,} calls each):")
    for name, values in per_call.items():
        value = min(values)
        runs = " / ".join(f"{v:,.0f}" for v in values)
        print(f"  {name:8} {value:10,.0f}  ({value - bare:+,.0f} over bare; loops: {runs})")
    print(f"  fxflops' own (over the floor): "
          f"{min(per_call['fxflops']) - min(per_call['floor']):+,.0f}; every call timed: "
          f"{min(per_call['timed']) - min(per_call['floor']):+,.0f}")
    if args.cache_sim:
        print_misses(runs, args.calls)
    return 0


def _events(part: str) -> dict[str, int]:
    """A callgrind dump's totals, by event name (callgrind's format may leave trailing
    zeros out of a totals line)."""
    with open(part) as f:
        text = f.read()
    names = re.search(r"^events: (.+)$", text, re.M).group(1).split()
    totals = [int(v) for v in re.search(r"^totals: (.+)$", text, re.M).group(1).split()]
    return dict(zip(names, totals + [0] * (len(names) - len(totals))))


def print_misses(runs: dict[str, list[dict[str, int]]], calls: int) -> None:
    """Per call over bare: each variant's misses and mispredicts (from its loop with fewer
    instructions, the one whose instructions are printed)."""
    best = {name: min(loops, key=lambda events: events["Ir"]) for name, loops in runs.items()}

    def per_call(name: str, events: tuple[str, ...]) -> float:
        return sum(best[name][e] for e in events) / calls

    print("  per call, simulated (callgrind --cache-sim --branch-sim):")
    print(f"  {'':8}" + "".join(f"{label:>19}" for label, _ in MISSES))
    for name in best:
        row = (f"{per_call(name, ev):,.0f}" if name == "bare"
               else f"{per_call(name, ev) - per_call('bare', ev):+,.1f}" for _, ev in MISSES)
        print(f"  {name:8}" + "".join(f"{cell:>19}" for cell in row))


if __name__ == "__main__":
    sys.exit(main())
