"""CUDA-event pairs in flight: one pool of pairs per device, and one queue read oldest
first (``recording.cuda_events`` says when pairs are recorded and read).

A pair is read with ``query()`` (never a wait on the calling thread) and ``elapsed_time``;
its sample goes to its row (``SizeStats.add_late``), or, where it cannot be read, is lost
(``add_lost``). At most ``max_in_flight`` pairs wait; past that the oldest pair's sample is
given up (its call stays counted). The queue has no lock of its own: every call is made
under its clock's lock (``CudaClock.lock``), which every write to an event-timed row's
counters holds.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from fxflops.util import warn_once

# a call whose device time is at most this times the host's between its two records, and
# which found the device idle, was paced by the host (``cuda_events``, "What a time says")
HOST_BOUND = 1.25

# a pair whose ``query()`` said unfinished is asked again by a chosen replay only once this
# many pairs were queued since (the device runs steps behind the host: asking at every
# chosen replay would be a CUDA call each, mostly answered no)
REREAD_AFTER = 2


class EventPair:
    """A start and an end event, the call they time and what its sample needs; pooled per
    device, reused once read. Readable once its end event has been recorded (``armed``)."""

    __slots__ = ("start", "end", "row", "device", "thread", "t0", "host_ns", "idle",
                 "shared", "armed", "failed", "seq", "halves")

    def __init__(self, start: Any, end: Any, device: int) -> None:
        self.start, self.end, self.device = start, end, device
        self.row: Any = None  # the row of the call it times (SizeStats)
        self.thread = self.t0 = self.host_ns = 0
        self.idle = self.shared = self.failed = False
        self.armed = True
        self.seq = 0  # its place in the queue (a pooled pair is queued again: not identity)
        self.halves = 2  # the calls its sample stands for, in halves (SizeStats.choose)

    def arm(self, row: Any, idle: bool, halves: int = 2) -> None:
        """Set for a call of ``row`` (``idle``: the device had run every earlier pair)."""
        self.row, self.idle, self.shared, self.halves = row, idle, False, halves


class EventQueue:
    """The pairs of one clock: in flight (``pending``, oldest first) and pooled."""

    def __init__(self, cuda: Any, max_in_flight: int = 1024) -> None:
        self.cuda = cuda
        self.max_in_flight = max_in_flight
        self.pending: deque[EventPair] = deque()
        self.pools: dict[int, list[EventPair]] = {}  # read pairs, for reuse, per device
        self.dropped = 0  # samples given up past max_in_flight
        self.queued = 0  # pairs queued so far (each pair's ``seq``)
        # the last pair found unfinished at the head of the queue: (its seq, ``queued``
        # then); a chosen replay asks it again only REREAD_AFTER pairs later
        self.stalled = (0, 0)

    def take(self, device: int) -> EventPair:
        """A pair from ``device``'s pool, or a new one."""
        pool = self.pools.get(device)
        if pool:
            return pool.pop()
        return EventPair(self.cuda.Event(enable_timing=True),
                         self.cuda.Event(enable_timing=True), device)

    def give_back(self, pair: EventPair) -> None:
        """``pair`` back in its device's pool (read, or never queued)."""
        self.pools.setdefault(pair.device, []).append(pair)

    def push(self, pair: EventPair) -> None:
        """Queue ``pair`` (its call counted); past ``max_in_flight`` the oldest pair's
        sample is given up."""
        pending = self.pending
        if len(pending) >= self.max_in_flight:
            pending.popleft().row.add_lost()
            self.dropped += 1
        self.queued += 1
        pair.seq = self.queued
        pending.append(pair)

    def worth_reading(self) -> bool:
        """Whether a read may find something new: a pair waits, and it is not the one
        found unfinished lately (asked again only ``REREAD_AFTER`` pairs later)."""
        pending = self.pending
        return bool(pending) and (pending[0].seq != self.stalled[0]
                                  or self.queued - self.stalled[1] >= REREAD_AFTER)

    def read_finished(self, limit: int | None = None) -> int:
        """(No capture in progress.) Credit the finished pairs, oldest first; returns how
        many left the queue. A pair that cannot be read loses its sample (and the pool)."""
        done = 0
        pending = self.pending
        while pending and (limit is None or done < limit):
            pair = pending[0]
            if not pair.armed:  # (a replay's pair, its end not recorded yet)
                break
            if pair.failed:  # (its replay raised: read as lost, never blocking the queue)
                pending.popleft()
                pair.row.add_lost()
                pair.failed = False
                self.give_back(pair)
                done += 1
                continue
            try:
                if not pair.end.query():
                    self.stalled = (pair.seq, self.queued)
                    break
                ns = int(pair.start.elapsed_time(pair.end) * 1e6)
            except RuntimeError as e:  # (an event CUDA cannot read: its sample is lost)
                pending.popleft()
                pair.row.add_lost()
                warn_once(f"cuda-read:{type(e).__name__}", "fxflops: a CUDA-event pair "
                          "could not be read; its sample is lost (%s: %s)", type(e).__name__, e)
                done += 1
                continue
            pending.popleft()
            pair.row.add_late(ns, pair.idle and ns <= HOST_BOUND * pair.host_ns,
                              pair.shared, pair.halves)
            self.give_back(pair)
            done += 1
        return done

    def read_on_devices(self) -> int:
        """(A collection.) Finished pairs read on their own device (fxflops' own threads
        never make CUDA calls on a device they were not told to)."""
        done = 0
        while self.pending:
            device = self.pending[0].device
            with self.cuda.device(device):
                n = 0
                while self.pending and self.pending[0].device == device:
                    if not self.read_finished(limit=1):
                        break
                    n += 1
            if not n:
                break
            done += n
        return done
