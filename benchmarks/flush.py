"""What the periodic report flush costs the host loop, with thousands of sizes seen.

    python benchmarks/flush.py [--sizes 3000] [--seconds 4] [--pairs 5] [--prometheus]

A compiled graph (eager inner, one dynamic size) is called over ``--sizes`` sizes in turn.
Each pair of rounds runs the same loop for the same number of calls twice, once with the
flush thread at ``FXFLOPS_FLUSH_S=1`` writing the report under a temporary folder and once
without it (in alternating order; the flush thread's pacing carries over from round to
round, as it does in a long run). Two figures: the median over pairs of the loop's time
with flushing over its time without (goal: within 5%), and the CPU time the flush thread
ran over the flushing loops' time (the most of the GIL it can have taken from the host: a
bound that the noise of a shared machine does not blur). ``--prometheus``: each flush also
writes the Prometheus counters' files (``FXFLOPS_PROMETHEUS=1``), as under ``vllm serve``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time

import torch

import fxflops
from fxflops.outputs.report_files import PeriodicFlush


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, default=3000)
    p.add_argument("--seconds", type=float, default=3.0, help="length of one round")
    p.add_argument("--pairs", type=int, default=15)
    p.add_argument("--prometheus", action="store_true", help="write the counters' files too")
    args = p.parse_args()
    out = tempfile.mkdtemp(prefix="fxflops-flush-")
    os.environ["FXFLOPS_OUT"] = out
    if args.prometheus:
        os.environ["FXFLOPS_PROMETHEUS"] = "1"
        os.environ["FXFLOPS_PROMETHEUS_DIR"] = tempfile.mkdtemp(prefix="fxflops-prom-")
    os.environ.pop("FXFLOPS_FLUSH_S", None)  # the benchmark runs the flush thread itself
    rec = fxflops.recorder()
    compiled = torch.compile(lambda x: x + 1, backend=fxflops.backend(inner="eager"),
                             dynamic=True)
    xs = [torch.zeros(n) for n in range(2, 2 + args.sizes)]
    for x in xs:  # every size seen once: its row exists
        compiled(x)
    rec.flush()  # the first write (every row, the capped per-size dumps) is not steady state
    periodic = rec.sink(PeriodicFlush)  # the sink that flushes every FXFLOPS_FLUSH_S

    def loop(calls: int) -> float:
        t0 = time.perf_counter()
        for i in range(calls):
            compiled(xs[i % len(xs)])
        return time.perf_counter() - t0

    start = time.perf_counter()
    loop(5 * len(xs))
    calls = int(args.seconds / ((time.perf_counter() - start) / (5 * len(xs))))

    busy: list[float] = []

    def flusher() -> None:
        periodic._background(1.0, 0.0)
        busy.append(time.thread_time())  # CPU seconds this thread ran: the GIL it can take

    def with_flushing() -> float:
        periodic._stopped = threading.Event()
        thread = threading.Thread(target=flusher, daemon=True)
        thread.start()
        try:
            return loop(calls)
        finally:
            periodic._stopped.set()
            thread.join()

    ratios, shares, spent = [], [], []
    for i in range(args.pairs):
        if i % 2:
            flushing, plain = with_flushing(), loop(calls)
        else:
            plain, flushing = loop(calls), with_flushing()
        ratios.append(flushing / plain)
        shares.append(busy[-1] / flushing)
        spent.append((busy[-1], flushing))
        print(f"pair {i + 1}: {calls:,} calls: without flushing {plain:.3f} s, with "
              f"FXFLOPS_FLUSH_S=1 {flushing:.3f} s (ratio {flushing / plain:.3f}; flush thread "
              f"busy {100 * shares[-1]:.2f}% of the loop)", flush=True)
    ratio = statistics.median(ratios)
    share = sum(b for b, _ in spent) / sum(t for _, t in spent)
    report = next((os.path.join(out, f) for f in os.listdir(out) if f.endswith(".json")), None)
    print(f"{args.sizes:,} sizes, flush every 1 s: host loop {100 * (ratio - 1):+.1f}% "
          f"(median of {args.pairs} pairs), flush thread busy {100 * share:.2f}% of the "
          f"flushing loops' time (goal: within 5%) {'OK' if ratio <= 1.05 and share <= 0.05 else 'MISSED'};"
          f" report {report}")


if __name__ == "__main__":
    main()
