"""Per-kernel time: N calls per size run under ``torch.profiler``, each kernel's events
matched to the kernel map (``cost.kernels``) and noted in the row.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from fxflops import config
from fxflops.cost.kernels import _HANDLE, CPP_EVENT, NONE, KernelCost


class KernelProfile:
    """The profiled calls of one (graph, size): each call's time, each kernel's per call,
    and the first calls' timelines (``fxflops trace``)."""

    __slots__ = ("calls", "call_ns", "kernels_ns", "samples", "trace", "unmatched")
    TRACED = 8  # timelines kept per (graph, size)

    def __init__(self) -> None:
        self.calls = 0
        self.call_ns: list[int] = []
        self.kernels_ns: list[int] = []  # per call: its kernels' time, added
        # per launch, by (kernel, its launch's place among that kernel's in the call): Inductor
        # launches one generated kernel more than once where two nodes' code is the same
        self.samples: dict[tuple[str, int], list[int]] = {}
        # per call: (its ns, [(kernel, start ns from the profile's start, ns)])
        self.trace: list[tuple[int, list[tuple[str, int, int]]]] = []
        self.unmatched = 0  # launches the profile showed no event of (a CUDA-graph replay)


def op_event(kernel: str) -> str:
    """The profiler event of an extern kernel's op: ``extern_kernels.mm`` -> ``aten::mm``,
    ``torch.ops._C.foo.default`` -> ``_C::foo``."""
    name = _HANDLE.sub("", kernel).removeprefix("torch.ops.")
    if name.startswith("extern_kernels."):
        return "aten::" + name.removeprefix("extern_kernels.")
    parts = name.split(".")
    if len(parts) >= 2:
        return f"{parts[0]}::{parts[1]}"
    return name


# what the profiler's C++ side prints while it starts and stops: Kineto's log lines, in its
# own logger's format, which nothing else uses ("USDT:2026-12-03 04:36:07 123:123 File.cpp:
# 52] profiler_start" on every start and stop, "STAGE:" ones, and its verbose lines,
# warnings and errors, such as a CUDA build's "ERROR:... gpuGetDeviceCount failed with code
# 35" on a host without a GPU). A server profiling N calls per size would flood its log
# with them. (A Kineto built with glog would write glog's format, which other libraries
# share: torch's builds do not, and such lines are kept.)
_PROFILER_LINE = re.compile(
    rb"(?:V|VERBOSE|INFO|WARNING|ERROR|STAGE|USDT|\?\?\?):"
    rb"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+:\d+\] ")


@contextlib.contextmanager
def profiler_quiet() -> Iterator[None]:
    """The process's stderr, around a profiler start or stop, without the profiler's own
    lines (Kineto's log lines, ``_PROFILER_LINE``): whatever else was written meanwhile
    (another thread's log) is written on after it. ``FXFLOPS_LOG=debug`` keeps them."""
    if config.LOG.get() == "debug":
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        spool = tempfile.TemporaryFile()  # (a file, not a pipe: a full pipe would block)
        os.dup2(spool.fileno(), 2)
    except (OSError, ValueError):  # no fd 2 (a daemon): nothing to keep quiet
        yield
        return
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        spool.seek(0)
        kept = b"".join(line for line in spool.read().splitlines(keepends=True)
                        if not _PROFILER_LINE.match(line))
        spool.close()
        if kept:
            os.write(2, kept)


# what makes a deliberate device sync legal where the host polices them (vLLM's
# ``VLLM_GPU_SYNC_CHECK``: its integration sets ``gpu_sync_allowed``); none by default
sync_allowed: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext


def _device_sync() -> None:
    import torch

    with sync_allowed():
        torch.cuda.synchronize()


def profile(call: Any, row: Any, kernels: list[KernelCost], device: str) -> tuple[Any, bool]:
    """Run ``call()`` (the graph's call, timed as any other) under ``torch.profiler`` and
    note each kernel's time in ``row.kernel_profile``. On a GPU the device is waited for
    before the profiler starts (kernels still queued from earlier calls, which share this
    call's kernel names, must not be taken for its own) and after the call (only these N
    calls per size), each sync allowed where the host polices syncs (``sync_allowed``).
    Returns what the call returned, and whether profiling worked: what the call raises
    propagates; fxflops' own failure (a refused sync among them) is warned once and the
    call's result returned."""
    import time

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from fxflops.util import warn_once

    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    try:
        if device == "cuda":
            _device_sync()  # earlier calls' kernels done: none in this profile
        prof = torch_profile(activities=activities)
        with profiler_quiet():
            prof.__enter__()
    except Exception as e:
        warn_once(f"kernel-profile:{type(e).__name__}", "fxflops: kernels not profiled "
                  "(%s: %s)", type(e).__name__, e)
        return call(), False
    synced = True
    try:
        t0 = time.perf_counter_ns()
        out = call()
        if device == "cuda":
            try:
                _device_sync()
            except Exception as e:  # (a refused sync: the call ran; its profile is not whole)
                synced = False
                warn_once(f"kernel-profile-sync:{type(e).__name__}", "fxflops: kernels not "
                          "profiled (the device sync was refused: %s: %s)", type(e).__name__, e)
        ns = time.perf_counter_ns() - t0
    finally:
        try:
            with profiler_quiet():
                prof.__exit__(None, None, None)
        except Exception:
            pass
    if not synced:
        return out, False
    try:
        found = match_events(list(prof.events()), kernels, device)
        note(row, ns, found, len([k for k in kernels if k.name != NONE]))
    except Exception as e:
        warn_once(f"kernel-profile:{type(e).__name__}", "fxflops: kernels not profiled "
                  "(%s: %s)", type(e).__name__, e)
        return out, False
    return out, True


def match_events(events: list[Any], kernels: list[KernelCost], device: str
                 ) -> list[tuple[str, int, int]]:
    """(kernel, start ns, ns) of each kernel event of one call, in order: generated kernels
    by name (a C++ kernel's ``graph_<id>_<name>`` event; a GPU kernel's own), extern calls
    by their op's event, in the order Inductor generated them (on a GPU: the time of the
    device kernels the op launched)."""
    generated = {k.name for k in kernels if not k.extern and k.name != NONE}
    externs = [k.name for k in kernels if k.extern]
    start0 = min((e.time_range.start for e in events), default=0)
    out: list[tuple[str, int, int]] = []
    next_extern = 0
    for e in sorted(events, key=lambda e: e.time_range.start):
        on_device = str(getattr(e, "device_type", "")).endswith("CUDA")
        match = CPP_EVENT.match(e.name)
        name = match.group(1) if match else e.name
        if name in generated and (on_device or device != "cuda"):
            out.append((name, int((e.time_range.start - start0) * 1e3),
                        int((e.time_range.end - e.time_range.start) * 1e3)))
        elif (next_extern < len(externs) and not on_device
              and e.name == op_event(externs[next_extern])
              and not (e.cpu_parent is not None and "::" in e.cpu_parent.name)):
            if device == "cuda":
                ns = int(sum(k.duration for k in getattr(e, "kernels", [])) * 1e3)
            else:
                ns = int((e.time_range.end - e.time_range.start) * 1e3)
            out.append((externs[next_extern], int((e.time_range.start - start0) * 1e3), ns))
            next_extern += 1
    return out


def launches(names: list[str]) -> list[tuple[str, int]]:
    """Each kernel launch of one call, in order, as (kernel, n): the n-th launch of that
    kernel in the call (``n`` from 0), which is the n-th entry of its name in the kernel
    map (the wrapper launches its kernels in the map's order)."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        n = seen.get(name, 0)
        seen[name] = n + 1
        out.append((name, n))
    return out


def note(row: Any, call_ns: int, found: list[tuple[str, int, int]], expected: int) -> None:
    """A profiled call: its time, its kernels' (``found``: ``match_events``) each under its
    launch, and the launches of the ``expected`` the profile showed no event of."""
    prof = row.kernel_profile
    if prof is None:
        prof = row.kernel_profile = KernelProfile()
    prof.calls += 1
    prof.call_ns.append(call_ns)
    prof.kernels_ns.append(sum(ns for _, _, ns in found))
    for launch, (_, _, ns) in zip(launches([name for name, _, _ in found]), found):
        prof.samples.setdefault(launch, []).append(ns)
    prof.unmatched += max(0, expected - len(found))
    if len(prof.trace) < KernelProfile.TRACED:
        prof.trace.append((call_ns, found))


