"""``fxflops trace PATH... -o trace.json``: the profiled calls and their kernels as a Chrome
trace (trace-event JSON), for Perfetto or chrome://tracing.

Per process (``pid``) and graph (``tid``), each profiled call (``FXFLOPS_KERNELS=N``) is a
complete event (``"ph": "X"``) with its size, FLOPs and bytes as ``args``; its kernels are
events inside it, each with its FLOPs, matmul FLOPs, bytes and arithmetic intensity. The
calls of one graph are laid end to end (the profiles hold each call's own timeline, not
the wall clock between calls).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fxflops.report.files import load_reports, run_id
from fxflops.report.schema import ReportError
from fxflops.util import write_output


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="write the profiled calls and kernels as a Chrome trace")
    p.add_argument("paths", nargs="+", help="report files or folders")
    p.add_argument("-o", "--output", default="fxflops-trace.json",
                   help="trace-event JSON to write (open it in Perfetto or chrome://tracing)")
    p.set_defaults(func=run)


def trace_events(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for rep in reports:
        pid = rep["process"].get("pid") or 0
        events.append({"ph": "M", "name": "process_name", "pid": pid,
                       "args": {"name": f"{rep['process'].get('host')} pid {pid} "
                                        f"(rank {rep['process'].get('rank')}, "
                                        f"run {run_id(rep)})"}})
        for tid, g in enumerate(rep["graphs"]):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": g["name"]}})
            clock = 0.0
            for row in g["rows"]:
                kernels = {k["kernel"]: k for k in row.get("kernels") or []}
                for call in (row.get("kernels_profile") or {}).get("trace") or []:
                    stamps = [k["start_us"] for k in call["kernels"]]
                    first = min(stamps, default=0.0)
                    events.append({
                        "ph": "X", "name": f"{g['name']} [size {row['size']}]", "cat": "graph",
                        "pid": pid, "tid": tid, "ts": clock, "dur": call["dur_us"],
                        "args": {"size": row["size"], "flops": row["flops"],
                                 "matmul_flops": row["matmul_flops"],
                                 "bytes_io": row["bytes_io"]}})
                    for k in call["kernels"]:
                        # inside the call's span (the profile starts a little before it)
                        start = clock + min(max(0.0, k["start_us"] - first), call["dur_us"])
                        dur = min(k["dur_us"], clock + call["dur_us"] - start)
                        figures = kernels.get(k["kernel"], {})
                        events.append({
                            "ph": "X", "name": k["kernel"], "cat": "kernel", "pid": pid,
                            "tid": tid, "ts": start, "dur": max(dur, 0.0),
                            "args": {f: figures.get(f) for f in
                                     ("flops", "matmul_flops", "bytes", "intensity")}})
                    clock += call["dur_us"] + 1.0  # end to end, one microsecond apart
    return events


def run(args: argparse.Namespace) -> int:
    skipped: list[str] = []
    reports = load_reports(args.paths, skipped)
    for line in skipped:
        print(f"fxflops trace: skipped {line}", file=sys.stderr)
    events = trace_events(reports)
    if not any(e["ph"] == "X" for e in events):
        raise ReportError("no profiled calls in these reports: run with FXFLOPS_KERNELS=N "
                          "(or fxflops.backend(kernels=N)) to profile N calls per size")
    write_output(args.output, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    print(f"wrote {args.output}: {sum(e['cat'] == 'graph' for e in events if 'cat' in e)} "
          f"calls, {sum(e['cat'] == 'kernel' for e in events if 'cat' in e)} kernel events")
    return 3 if skipped else 0
