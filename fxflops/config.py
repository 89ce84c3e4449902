"""Every ``FXFLOPS_*`` environment variable, typed, read when used (never frozen at import).

A bad value never raises: it is warned about once (the variable, the value, the default
used) and the default is taken. ``VARIABLES`` is the one table of them; docs/reference.md
shows the same table (a test keeps the two equal).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from typing import Generic, TypeVar

from fxflops.util import warn_once

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Variable(Generic[T]):
    name: str
    parse: Callable[[str], T]
    default: T
    doc: str

    def get(self) -> T:
        raw = os.environ.get(self.name)
        if raw is None:
            return self.default
        try:
            return self.parse(raw)
        except (TypeError, ValueError) as e:
            warn_once(f"env:{self.name}={raw}", "fxflops: %s=%r is not valid (%s); using the "
                      "default %r", self.name, raw, e, self.default)
            return self.default


def _text(raw: str) -> str | None:
    return raw.strip() or None


def _flag(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError("expected 1/0, true/false, yes/no or on/off")


def _positive_int(raw: str) -> int:
    value = int(raw.strip())
    if value < 1:
        raise ValueError("must be a whole number of at least 1")
    return value


def _seconds(raw: str) -> float:
    """A period in seconds; 0 switches the periodic job off."""
    value = float(raw.strip())
    if not math.isfinite(value) or value < 0:
        raise ValueError("must be a number of seconds, 0 or more")
    return value


def _peak(raw: str) -> float | None:
    if not raw.strip():
        return None
    value = float(raw.strip())
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be a positive number")
    return value


def _optional_whole(low: int, high: int | None, message: str
                    ) -> Callable[[str], int | None]:
    """A whole number from ``low`` to ``high`` (no bound: None); blank: None (unset)."""
    def parse(raw: str) -> int | None:
        if not raw.strip():
            return None
        value = int(raw.strip())
        if value < low or (high is not None and value > high):
            raise ValueError(message)
        return value

    return parse


_count = _optional_whole(0, None, "must be a whole number, 0 or more")
_port = _optional_whole(1, 65535, "must be a port number, 1 to 65535")
_rank = _optional_whole(0, None, "must be 0 or more")


ENABLED = Variable("FXFLOPS", _flag, False,
                   "vLLM: instrument whatever vLLM compiles (see [vllm.md](vllm.md))")
OUT = Variable("FXFLOPS_OUT", _text, None,
               "folder for one report per process, `fxflops-HOST-PID[-rankN].json`, written "
               "atomically at exit, at SIGTERM and at vLLM worker shutdown; graph dumps in "
               "`OUT/graphs/`")
FLUSH_S = Variable("FXFLOPS_FLUSH_S", _seconds, 0.0,
                   "also rewrite the report every s seconds (0: only at exit; 5 under vLLM)")
LOG_INTERVAL = Variable("FXFLOPS_LOG_INTERVAL", _seconds, 0.0,
                        "log `fxflops stats (graph, size, calls, median_ms, GFLOPs, GFLOP/s)` "
                        "every s seconds (0: never)")
PEAK_TFLOPS = Variable("FXFLOPS_PEAK_TFLOPS", _peak, None,
                       "peak TFLOP/s for MFU and the roofline (overrides the device table)")
PEAK_GBPS = Variable("FXFLOPS_PEAK_GBPS", _peak, None,
                     "peak GB/s for bandwidth use and the roofline (overrides the table)")
WINDOW = Variable("FXFLOPS_WINDOW", _positive_int, 512,
                  "samples kept per (graph, size) for the median and percentiles")
# a lower bound, not the count: a (graph, size)'s first calls are each timed, at least
# this many, rounded up to a multiple of SAMPLE_EVERY (``timed_first``: with the default
# stride, its first 256); short runs (the demo, a test, the tuner's sweep) time every
# call; a server's steady state samples
MIN_TIMED_FIRST = 16


def timed_first(every: int) -> int:
    """The calls of a (graph, size) each timed before one in ``every`` is:
    ``MIN_TIMED_FIRST`` rounded up to a multiple of ``every`` (the first ``every`` calls
    from 16 on), so that the calls from there on are sampled at its multiples."""
    return -(-MIN_TIMED_FIRST // every) * every


# one in 256, not fewer: a sampled call takes another path than its neighbours, and the
# calls after it run slower while the CPU's predictors relearn the model's (about 5 us in
# all here, spread over the next ten calls; 0.3 us a call at one in 16: docs/benchmarks.md)
SAMPLE_EVERY = Variable("FXFLOPS_SAMPLE_EVERY", _positive_int, 256,
                        f"time a (graph, size)'s first calls ({MIN_TIMED_FIRST} rounded up to a "
                        "multiple of this: this many from 16 on), then one call in this many; "
                        "count every one (1: time every call; the CPU clock's path; see "
                        "[conventions.md](conventions.md))")
# a CUDA graph's replays (vLLM's piecewise graphs: one per piece per step) are counted
# every one and timed by a sample: each timed replay costs five CUDA calls and the clock's
# lock, several microseconds of the host's; counting alone costs a fraction of one
# (``CudaClock``'s text, docs/conventions.md)
REPLAY_SAMPLE_EVERY = Variable(
    "FXFLOPS_REPLAY_SAMPLE_EVERY", _positive_int, 32,
    f"CUDA graphs holding one instrumented call (vLLM's piecewise graphs): count every "
    f"replay, time a (graph, size)'s first {MIN_TIMED_FIRST} replays, then one in this many "
    "on average, at random strides (seeded; 1: time every replay; see "
    "[conventions.md](conventions.md))")
MAX_SIZES = Variable("FXFLOPS_MAX_SIZES", _positive_int, 8192,
                     "sizes kept per graph; calls at further sizes go to its `overflow` row")
RANK = Variable("FXFLOPS_RANK", _rank, None,
                "the global rank written in the report (else vLLM's, torch.distributed's or "
                "torchrun's `RANK`; see [many-devices.md](many-devices.md))")
RUN_ID = Variable("FXFLOPS_RUN_ID", _text, None,
                  "the run a report belongs to: set by the first fxflops process, inherited by "
                  "the processes it starts (vLLM's workers), agreed on by the ranks of a "
                  "torch.distributed job; set it to group processes started apart")
DUMP_DIR = Variable("FXFLOPS_DUMP_DIR", _text, None,
                    "another folder for the annotated graph dumps (vLLM: set to "
                    "`<debug_dump_path>/rank_*/fxflops`)")
KERNELS = Variable("FXFLOPS_KERNELS", _count, None,
                   "map every node to the Inductor kernel it ran in, and profile N calls per "
                   "size under `torch.profiler` for each kernel's time (0: the map only; see "
                   "[kernels.md](kernels.md))")
LOG = Variable("FXFLOPS_LOG", _text, None,
               "`debug`: keep what the profiler itself prints at each profiled call (Kineto's "
               "log lines: `USDT`/`STAGE` ones, its warnings and errors; dropped otherwise; "
               "see [kernels.md](kernels.md))")
PROMETHEUS = Variable("FXFLOPS_PROMETHEUS", _flag, False,
                     "export Prometheus counters (written at each flush; under vLLM they show "
                     "in its `/metrics`, see [serving.md](serving.md))")
PROMETHEUS_DIR = Variable("FXFLOPS_PROMETHEUS_DIR", _text, None,
                          "where the counters' files go when `PROMETHEUS_MULTIPROC_DIR` is unset, "
                          "or with `FXFLOPS_PROMETHEUS_PORT` (vLLM: made by the API server, "
                          "inherited by its workers)")
PROMETHEUS_PORT = Variable("FXFLOPS_PROMETHEUS_PORT", _port, None,
                           "serve this node's counters on this port (`/metrics`, one exporter "
                           "per node, for nodes without vLLM's API server; see "
                           "[many-devices.md](many-devices.md))")
PROMETHEUS_SIZES = Variable("FXFLOPS_PROMETHEUS_SIZES", _positive_int, 32,
                            "sizes per graph with a `size` label of their own; later ones are "
                            "summed under `size=\"other\"`")

VARIABLES: tuple[Variable, ...] = (ENABLED, OUT, FLUSH_S, LOG_INTERVAL, PEAK_TFLOPS, PEAK_GBPS,
                                   WINDOW, SAMPLE_EVERY, REPLAY_SAMPLE_EVERY, MAX_SIZES, RANK,
                                   RUN_ID, DUMP_DIR, KERNELS, LOG, PROMETHEUS, PROMETHEUS_DIR, PROMETHEUS_PORT, PROMETHEUS_SIZES)


def warn_unknown_variables() -> None:
    """One warning for each ``FXFLOPS_*`` variable set that fxflops does not know (a typo
    would otherwise be silently ignored), with the nearest known name."""
    import difflib

    known = {v.name for v in VARIABLES}
    for name in sorted(os.environ):
        if not name.startswith("FXFLOPS") or name in known:
            continue
        near = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        warn_once(f"env-unknown:{name}", "fxflops: %s is not an fxflops setting; ignored%s",
                  name, hint)


def markdown_table() -> str:
    """The table docs/reference.md shows."""
    lines = ["| variable | default | effect |", "|---|---|---|"]
    for v in VARIABLES:
        default = "unset" if v.default is None else str(v.default)
        if isinstance(v.default, bool):
            default = "0"
        lines.append(f"| `{v.name}` | {default} | {v.doc} |")
    return "\n".join(lines)
