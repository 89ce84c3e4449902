"""When a reader collects the CUDA-event samples, and how long it waits for them.

Rows timed by CUDA events count a call when it is made and get its sample when its events
are read (``cuda_events``). Whoever reads the rows (a report's flush, a scrape, a scope's
end) collects first; a flush waits a bounded time for the samples still in flight (a hung
device or NCCL costs at most that), a signal's flush less, and the exit after a signal's
flush not again. A reset of the recorder's rows goes to the clocks' captured graphs the
same way (``forget_captured_rows``). Nothing is imported here where no CUDA clock was ever
made, so the signal path imports nothing.
"""

from __future__ import annotations

import sys

from fxflops.util import host_raised, warn_once

# how long a flush (the background thread's, exit's, a signal's) waits for CUDA-event
# samples still in flight: a hung device or NCCL costs at most this, then the report is
# written with what was read, and says how many calls are still untimed
DEVICE_WAIT_S = 3.0
# at SIGTERM/SIGINT: a server being stopped must end promptly (a grace period counts it)
SIGNAL_DEVICE_WAIT_S = 1.0
# how long a signal handler waits for the CUDA clock's lock (the thread it interrupted may
# hold it: then that round's reads are skipped, never waited for)
SIGNAL_LOCK_WAIT_S = 0.5
# a signal's flush has waited for the device: the exit that follows does not wait again
_SIGNALLED: list[bool] = []


def collect_samples(wait: bool = False, final: bool = False, in_signal: bool = False) -> None:
    """Count CUDA-graph replays and read the CUDA-event samples that have arrived (``wait``:
    wait up to ``DEVICE_WAIT_S`` for those in flight; ``final``: the last replays' too;
    ``in_signal``: from a signal handler, which waits less and never for a lock).
    Nothing to do, and nothing imported, where no CUDA clock was ever made."""
    timing = sys.modules.get("fxflops.recording.cuda_events")
    if timing is None:
        return
    if in_signal:
        wait_s = SIGNAL_DEVICE_WAIT_S
    elif _SIGNALLED or not (wait or final):
        wait_s = 0.0
    else:
        wait_s = DEVICE_WAIT_S
    try:
        got = timing.collect_all(wait_s=wait_s,
                                 lock_timeout=SIGNAL_LOCK_WAIT_S if in_signal else -1,
                                 final=final)
    except Exception as e:  # a device error must not stop the report
        if host_raised(e):
            raise
        warn_once("harvest", "fxflops: could not read CUDA-event samples (%s: %s)",
                  type(e).__name__, e)
        return
    if in_signal:
        _SIGNALLED.append(True)
    if final and got.in_flight:
        warn_once("in-flight", "fxflops: %d CUDA-event samples still in flight after %.1f s "
                  "(the device is busy or hung); the report counts their calls, untimed",
                  got.in_flight, wait_s)
    if got.skipped_lock:
        warn_once("in-flight-lock", "fxflops: the signal came while fxflops was timing a "
                  "call; the samples in flight are not read in this report")


def forget_captured_rows() -> None:
    """The recorder forgot its rows: CUDA graphs captured before look theirs up again
    (nothing to do, and nothing imported, where no CUDA clock was ever made)."""
    timing = sys.modules.get("fxflops.recording.cuda_events")
    if timing is not None:
        timing.forget_rows()


def in_flight() -> int:
    """CUDA-event samples not read yet (0 where no CUDA clock was ever made)."""
    timing = sys.modules.get("fxflops.recording.cuda_events")
    return timing.status()["in_flight"] if timing is not None else 0
