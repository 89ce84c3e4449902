"""Per (graph, size) statistics with bounded memory, and what they mean.

The hot path counts every call and times a sample of them (``InstrumentedGraph``: every
call at first, then one in ``FXFLOPS_SAMPLE_EVERY``: ``note``; a CUDA graph's replays: its
first ones, then one in ``FXFLOPS_REPLAY_SAMPLE_EVERY`` at random strides: ``choose``); a
sample is a sum and one slot of a fixed-size ring buffer. Medians and percentiles are
computed when a report is made, never per call.

**Chosen, timed, lost.** A call picked to be timed is *chosen*: a sampled one (the CPU
clock's, a CUDA graph's replay), or each call where every one is timed (eager CUDA calls, a
FULL graph's replays); its sample either comes (``timed``) or never does (``lost``); until
then it is in flight, so that ``timed + lost <= chosen <= count``, equal once every sample
is in.

**Counts exact under threads.** A row's calls are numbered by a counter whose ``next()``
is one C call (an iterator over ``range(sys.maxsize)``): under the GIL no other thread runs
inside it, so threads calling one graph at one size each get a number of their own and no
call is lost, at about a tenth of what taking a lock costs (benchmarks/overhead.py). How
many numbers it gave is read through the iterator protocol's length hint, what is left of
the range (``taken``), without taking one. A free-threaded Python (3.13t, 3.14t) has no
GIL to make that call atomic, and there the counter takes a lock (``LockedCount``; chosen
at import, by ``sys._is_gil_enabled()``). Everything else a row holds (samples, bulk
counts) is written under the row's lock.
"""

from __future__ import annotations

import operator
import sys
import threading
from array import array
from statistics import median
from typing import TYPE_CHECKING, Any

from fxflops import config

if TYPE_CHECKING:
    from fxflops.cost.graph_cost import CostAt


# how many calls a counter numbers at most (a billion calls a second would take 292 years
# to reach it): a range whose iterator's ``next()`` is one C call (of C longs where a C long
# is 64 bits; Windows' 32-bit long makes it Python's long range: as exact, a little slower)
COUNTER_LIMIT = sys.maxsize


def range_counter() -> Any:
    """0, 1, 2, ...: the call counter where the GIL makes its one C call atomic."""
    return iter(range(COUNTER_LIMIT))


class LockedCount:
    """``range_counter``'s ``next()`` and length hint, under a lock: the call counter where
    no GIL makes one C call atomic (a free-threaded Python)."""

    __slots__ = ("_lock", "_next")

    def __init__(self) -> None:
        self._next = 0
        self._lock = threading.Lock()

    def __next__(self) -> int:
        with self._lock:
            n = self._next
            self._next = n + 1
        return n

    def __length_hint__(self) -> int:
        return COUNTER_LIMIT - self._next


# the call counter rows use (``SizeStats.calls``)
CallCounter: Any = range_counter if getattr(sys, "_is_gil_enabled", lambda: True)() \
    else LockedCount


def taken(counter: Any) -> int:
    """How many numbers ``counter`` (a ``CallCounter()``) gave, without taking one: what its
    length hint says is left of its range, from the limit."""
    return COUNTER_LIMIT - operator.length_hint(counter)


# marks a row keeps waiting for their samples at most (``mark``)
MAX_WAITING = 64


class RowMark:
    """A row's counters at one moment (``mark``): what a scope's figures are differences
    of (``since``). The calls are counted as they are made; their samples (and losses)
    come in the order the calls were chosen, on a device's clock later: so the sample
    fields are those of the moment the calls chosen by the mark have all had theirs
    (``ripe``; until then, as they were when it was taken)."""

    __slots__ = ("count", "chosen", "runtime_flops", "runtime_bytes", "runtime_calls",
                 "timed", "total_ns", "lost", "host_bound", "shared", "ripe")

    def __init__(self, row: SizeStats | None = None) -> None:
        """(Under ``row``'s lock; None: a row before its first call.)"""
        if row is None:
            for name in self.__slots__:
                setattr(self, name, 0)
            return
        self.count, self.chosen = row.count, row.chosen
        runtime = row.runtime or NO_RUNTIME
        self.runtime_flops, self.runtime_bytes = runtime.flops, runtime.bytes
        self.runtime_calls = runtime.calls
        self.read_samples(row)
        self.ripe = row.timed + row.lost >= self.chosen

    def read_samples(self, row: SizeStats) -> None:
        """(Under ``row``'s lock.)"""
        self.timed, self.total_ns, self.lost = row.timed, row.total_ns, row.lost
        self.host_bound, self.shared = row.host_bound, row.shared
        self.ripe = True


_ZERO = RowMark()


class RuntimeCounts:
    """FLOPs and bytes counted per call from run-time state (vLLM attention: pairs and KV
    cache read; a MoE's tokens from other data-parallel ranks), summed over the calls that
    counted them (``recording.runtime_costs.charge_runtime``): attached to the rows of a
    graph with run-time-costed nodes, and to whole forwards."""

    __slots__ = ("terms", "groups", "flops", "bytes", "calls", "by_kind")

    def __init__(self, terms: list[tuple[str, str | None, int, int]],
                 by_kind: bool = False) -> None:
        # (kind, layer, FLOPs per pair, bytes per context token) of the run-time-costed
        # ops at this size; grouped by sliding window at the first call (``groups``)
        self.terms = terms
        self.groups: list[tuple[Any, int | None, int, int, str]] | None = None
        self.flops = self.bytes = self.calls = 0
        # whole forwards: ``flops`` by kind, which the report sets beside vLLM's components
        self.by_kind: dict[str, int] | None = {} if by_kind else None


NO_RUNTIME = RuntimeCounts([])


class ForwardCounts:
    """A whole forward's row only (vLLM): the tokens scheduled, per count of them, before
    the runner padded them to the row's size (under CUDA graphs), and how many forwards
    ran as CUDA-graph replays. Written under the row's lock."""

    __slots__ = ("scheduled", "captured")

    def __init__(self) -> None:
        self.scheduled: dict[int, int] = {}
        self.captured = 0

    def note_scheduled(self, tokens: int) -> None:
        """A forward of ``tokens`` real tokens ran at the row's (padded) size. The distinct
        counts kept are bounded by the size itself (0 < tokens <= size)."""
        scheduled = self.scheduled
        scheduled[tokens] = scheduled.get(tokens, 0) + 1

    def scheduled_tokens(self) -> tuple[int, int]:
        """(forwards noted, tokens the scheduler gave them)."""
        # a snapshot (one C-level copy): the serving thread may add a count meanwhile
        scheduled = list(self.scheduled.items())
        return sum(c for _, c in scheduled), sum(n * c for n, c in scheduled)


class SizeStats:
    """Timings of one (graph, size): calls, samples taken, their sum, and the last
    ``WINDOW`` samples (ns)."""

    __slots__ = ("key", "size", "cost", "total_ns", "window", "cap", "timed", "lost",
                 "runtime", "forward", "kernel_profile", "due", "paid", "fresh_from", "lock",
                 "calls", "bulk", "host_bound", "shared", "on_device", "chosen", "last_chosen",
                 "waiting", "__weakref__")

    def __init__(self, key: tuple[int, ...], size: int | str, cost: CostAt | None = None,
                 cap: int | None = None) -> None:
        cap = cap or config.WINDOW.get()
        # every write to the row's counts and samples holds it: a call's read-modify-write
        # of ``count`` from two threads at once (the inner releases the GIL while it runs;
        # a free-threaded Python has none) would lose calls. Re-entrant: a signal handler
        # (a report's flush, which collects CUDA samples into rows) may run on a thread
        # that holds it; nothing blocks while it is held.
        self.lock = threading.RLock()
        self.key = key
        self.size = size
        self.cost = cost  # CostAt for this size (None for whole-forward rows)
        # calls made, numbered as they are made (``count``): ``next(row.calls)`` counts one,
        # exactly under threads; ``bulk``: calls counted many at a time (a CUDA graph's
        # replays), under the lock
        self.calls = CallCounter()
        self.bulk = 0
        # the samples' sum, each times the calls it stands for: itself, or under the CPU
        # clock's sampling itself and the calls after it left untimed (``note``), or under
        # a replay's sampling half the stretch before it and half the one after (``choose``);
        # it only grows (a Prometheus counter)
        self.total_ns = 0
        # preallocated once per size: adding a sample is one store, no growth, no branch
        self.window = array("q", bytes(8 * cap))
        self.cap = cap
        # samples taken (the next one's slot is ``timed % cap``): fewer than ``count`` when
        # the CPU clock samples a size's calls, or while CUDA events have not been read
        # (they time a call after it was counted: ``add_late``)
        self.timed = 0
        # the CPU clock's sampling (``note``): a call is timed when ``count``
        # has reached ``due``, which each sample moves on: to the next call during a size's
        # first calls, then to the next multiple of FXFLOPS_SAMPLE_EVERY (graphs of one
        # record share it: each sample stands for the calls until the one it made due)
        self.due = 0
        # the calls ``total_ns`` stands for so far (calls 0 to ``paid``): ``due`` but after a
        # scope opened (``retime``), which makes calls due again that samples stood for
        self.paid = 0
        # the number of the first call of the row's latest run of first calls each timed
        # (0; a scope's first call: ``retime``)
        self.fresh_from = 0
        # calls whose sample never came (the timer dropped it, or a CUDA-graph replay's
        # events were recorded again before they were read)
        self.lost = 0
        # calls picked to be timed (see the module's text): ``timed + lost`` once read
        self.chosen = 0
        # a replayed row's sampling (``choose``): the number of the last call chosen (its
        # samples' weights are the stretches between chosen calls); its next is ``due``
        self.last_chosen = -1
        # of the samples taken by CUDA events: those paced by the host's launches (the
        # device idle at the call's start, its time no longer than the host's launching),
        # and those shared with another thread's call open on the device at the same time
        # (each holds the other's kernels: vLLM's eager micro-batches). See cuda_events.
        self.host_bound = 0
        self.shared = 0
        self.on_device = False  # timed by the device (CUDA events): the above are known
        # what only some rows have: FLOPs and bytes counted per call from run-time state
        # (``RuntimeCounts``: a graph with vLLM attention, a whole forward), a whole
        # forward's tokens and replays (``ForwardCounts``)
        self.runtime: RuntimeCounts | None = None
        self.forward: ForwardCounts | None = None
        # the calls profiled per kernel (fxflops.recording.kernel_profile.KernelProfile), when asked
        self.kernel_profile: Any = None
        # marks whose samples are still to come (``mark``; None: none)
        self.waiting: list[RowMark] | None = None

    @property
    def count(self) -> int:
        """The calls made."""
        return taken(self.calls) + self.bulk

    def add(self, ns: int) -> None:
        """A call that returned after ``ns``, every call timed: its sample is in place
        before it is counted (a reader never sees a call without its sample)."""
        with self.lock:
            self._sample(ns)
            self.chosen += 1
            next(self.calls)

    def note(self, ns: int, n: int, first: int, every: int) -> None:
        """The sample of call ``n`` (counted as it was made: ``next(row.calls)``), which
        took ``ns``: the CPU clock's sampling, where a call is sampled when its number has
        reached ``due``. The next call is due next while the size's ``first`` calls (since
        ``fresh_from``) are each timed, then at the next multiple of ``every``;
        ``total_ns`` has stood for the calls before ``paid`` so far, and this sample stands
        for those from there to the new ``due`` (itself and the calls left untimed after
        it; where threads raced to one due call, the first sample in takes the stretch and
        the others none)."""
        with self.lock:
            t = self.timed
            self.window[t % self.cap] = ns
            self.timed = t + 1
            self.chosen += 1
            due = n + 1 if n + 1 - self.fresh_from < first else (n // every + 1) * every
            if due > self.paid:
                self.total_ns += ns * (due - self.paid)
                self.paid = due
            if due > self.due:
                self.due = due
            # (no mark waits on a row timed here: its call is chosen and timed at once)

    def retime(self) -> None:
        """Time the next calls each again, as a new size's first ones are (a scope opened:
        a scope of a few calls has its own median). Sampled rows only (the CPU clock's,
        ``note``); ``total_ns`` is not counted twice for calls a sample already stood
        for (``paid``)."""
        with self.lock:
            if self.last_chosen < 0:  # (a replayed row's sampling is ``choose``'s)
                self.fresh_from = self.count
                self.due = min(self.due, self.fresh_from)

    # --- calls timed later (CUDA events): counted when made, timed when read ----------

    def add_call(self) -> None:
        """A call made and chosen, whose time arrives later (``add_late``), or never
        (``add_lost``)."""
        next(self.calls)
        with self.lock:
            self.chosen += 1

    def add_calls(self, n: int) -> None:
        """``n`` calls made and chosen, whose times arrive later, or never (a CUDA graph's
        replays, counted at a collection)."""
        with self.lock:
            self.bulk += n
            self.chosen += n

    def choose(self, n: int, stride: int) -> int:
        """Call ``n`` (numbered as it was made: ``next(row.calls)``), which has reached
        ``due``: chosen to be timed, and the next due ``stride`` calls on (a CUDA graph's
        replays: the clock draws the stride). Returns what its sample stands for, in half
        calls: half the stretch since the last chosen call and half the stride, so that
        the samples' weights add up to the middle of the stretch the calls are in, where
        the count is on average (``total_ns`` neither runs ahead of the calls, as a whole
        next stride would, nor behind them); 2 (one call) where every call is chosen.
        0: not chosen (another thread's call took this stretch first: ``due`` moved past
        ``n`` meanwhile)."""
        with self.lock:
            if n < self.due:
                return 0
            halves = n - self.last_chosen + stride
            self.last_chosen = n
            self.due = n + stride
            self.chosen += 1
            return halves

    def add_late(self, ns: int, host_bound: bool = False, shared: bool = False,
                 halves: int = 2) -> None:
        """The sample of a call counted by ``add_call`` (or about to be: a replay's
        sample may be read before its count is collected); whether the host paced it, and
        whether another thread's call shared its time (see ``host_bound``, ``shared``);
        ``halves``: the calls it stands for, in halves (``choose``; 2: itself)."""
        with self.lock:
            self._sample(ns, halves)
            self.host_bound += host_bound
            self.shared += shared
            self.on_device = True

    def _sample(self, ns: int, halves: int = 2) -> None:
        """(Under the lock.)"""
        n = self.timed
        self.window[n % self.cap] = ns
        self.total_ns += ns if halves == 2 else ns * halves // 2
        self.timed = n + 1
        if self.waiting is not None:
            self._ripen()

    def add_lost(self, n: int = 1) -> None:
        """``n`` calls counted by ``add_call`` whose samples will never come."""
        with self.lock:
            self.lost += n
            if self.waiting is not None:
                self._ripen()

    # --- marks (``mark``): a scope's figures are differences (``recording.scopes``) ----

    def _ripen(self) -> None:
        """(Under the lock, a sample or a loss just came.) Marks whose calls' samples have
        all come read them now."""
        waiting = self.waiting or []
        outcomes = self.timed + self.lost
        for mark in [m for m in waiting if outcomes >= m.chosen]:
            mark.read_samples(self)
            waiting.remove(mark)
        if not waiting:
            self.waiting = None

    @property
    def samples_taken(self) -> int:
        return self.timed

    @property
    def awaiting(self) -> int:
        """Calls chosen whose sample has not come yet, and may still (CUDA events time a
        call after it is counted)."""
        return max(0, self.chosen - self.timed - self.lost)


    def totals(self, cost: CostAt | None = None) -> tuple[int, int, int, int]:
        """(FLOPs, matmul FLOPs, bytes) done over all calls, and the calls: the static cost
        per call (``cost``: a whole forward's, which its graphs give) times the calls, plus
        the run-time counts summed as they ran (exact ints; the Prometheus counters and the
        report's ``total_*`` figures)."""
        cost, n = cost or self.cost, self.count
        runtime = self.runtime or NO_RUNTIME
        flops = (cost.flops * n if cost else 0) + runtime.flops
        matmul = (cost.matmul_flops * n if cost else 0) + runtime.flops
        bytes_ = (cost.bytes_io * n if cost else 0) + runtime.bytes
        return int(flops), int(matmul), int(bytes_), n

    def samples(self) -> array[int]:
        """The samples kept: the last ``cap`` (all of them while fewer were taken)."""
        return self.window[: min(self.samples_taken, len(self.window))]

    def percentiles(self) -> dict[str, float]:
        """median, p10, p90 of the window, in milliseconds."""
        ordered = sorted(self.samples())
        if not ordered:
            return {"median_ms": 0.0, "p10_ms": 0.0, "p90_ms": 0.0}
        n = len(ordered)

        def pick(q: float) -> float:
            return ordered[min(n - 1, int(q * (n - 1) + 0.5))] / 1e6

        return {"median_ms": median(ordered) / 1e6, "p10_ms": pick(0.1), "p90_ms": pick(0.9)}


def mark(row: SizeStats) -> RowMark:
    """``row``'s counters as they are now, its samples' as they will be once the calls
    chosen by now have their samples (or are lost): samples come in the order their calls
    were chosen, after them on a device's clock (``SizeStats._ripen``)."""
    with row.lock:
        taken_now = RowMark(row)
        if not taken_now.ripe:
            waiting = row.waiting
            if waiting is None:
                waiting = row.waiting = []
            elif len(waiting) >= MAX_WAITING:  # (bounded: the oldest keeps what it has)
                del waiting[0]
            waiting.append(taken_now)
    return taken_now


def since(row: SizeStats, start: RowMark | None, end: RowMark | None = None) -> SizeStats:
    """A detached row of what ``row`` recorded from ``start`` to ``end`` (its marks; None:
    from its first call, to now): calls, samples, their sum, losses, run-time counts, all
    exact differences, and the samples still in its window."""
    then = start or _ZERO
    out = SizeStats(row.key, row.size, row.cost, 1)
    with row.lock:
        now = end or RowMark(row)
        first = max(then.timed, now.timed - row.cap, row.timed - row.cap)
        kept = [row.window[i % row.cap] for i in range(first, now.timed)]
        out.on_device = row.on_device
        if row.runtime is not None:
            out.runtime = runtime = RuntimeCounts(row.runtime.terms)
            runtime.groups = row.runtime.groups
            runtime.flops = now.runtime_flops - then.runtime_flops
            runtime.bytes = now.runtime_bytes - then.runtime_bytes
            runtime.calls = now.runtime_calls - then.runtime_calls
    out.window = array("q", kept)
    out.bulk = now.count - then.count
    for name in ("chosen", "timed", "total_ns", "lost", "host_bound", "shared"):
        setattr(out, name, getattr(now, name) - getattr(then, name))
    return out


def size_label(key: tuple[int, ...]) -> int | str:
    """One number when every size symbol has the same value (vLLM: tokens), else ``AxB``."""
    if not key:
        return "static"
    if all(k == key[0] for k in key):
        return int(key[0])
    return "x".join(str(k) for k in key)


def parse_size(size: Any) -> tuple[int, ...] | None:
    """The numbers of a size label: ``8`` -> (8,), ``"2x16"`` -> (2, 16); else None."""
    if isinstance(size, int) and not isinstance(size, bool):
        return (size,)
    parts = str(size).split("x")
    if all(p.isdigit() for p in parts):
        return tuple(int(p) for p in parts)
    return None


