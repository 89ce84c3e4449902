"""The report files and their flushing: the process's report in ``$FXFLOPS_OUT`` (written
atomically: a reader sees a whole file, the old or the new), its started-file, and the
daemon thread that flushes every ``FXFLOPS_FLUSH_S`` seconds and logs a line every
``FXFLOPS_LOG_INTERVAL`` seconds, never in the hot path. Both are sinks of the recorder
(``recording.recorder.Sink``), attached by ``outputs.session.attach``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time

from fxflops import config
from fxflops.outputs import lifecycle
from fxflops.recording.recorder import Recorder, Sink, Snapshot
from fxflops.recording.store import GraphRecord, UninstrumentedGraph
from fxflops.report.build import build_report, recorder_rows
from fxflops.report.files import report_filename, started_filename, write_atomic
from fxflops.util import atomic_text, stop_signals_blocked, warn_once, write_or_warn

log = logging.getLogger(__name__)

# the share of the time the background thread may spend writing reports
_DUTY = 0.01


def report_path(rec: Recorder) -> str | None:
    """Where ``rec``'s report goes: ``$FXFLOPS_OUT/fxflops-...json`` (None: nowhere)."""
    out = config.OUT.get()
    return os.path.join(out, report_filename(rec.info)) if out else None


def log_line(rec: Recorder) -> str:
    """The periodic log line: per graph and size, calls, median, GFLOPs, GFLOP/s."""
    parts = []
    for row in recorder_rows(rec):
        parts.append(f"({row['graph']}, {row['size']}, {row['calls']}, "
                     f"{row['median_ms']:.3f}, {row['gflops']:.2f}, "
                     f"{(row['tflops'] or 0) * 1e3:.1f})")
    return ("fxflops stats (graph, size, calls, median_ms, GFLOPs, GFLOP/s): ["
            + ", ".join(parts) + "]")


class ReportFiles(Sink):
    """The report in ``$FXFLOPS_OUT`` at each flush (beside another thread's flush too: a
    whole file, written atomically), and this process's started-file there at its first
    graph."""

    def __init__(self) -> None:
        self._started = False

    def writes(self) -> bool:
        return bool(config.OUT.get())

    def record(self, snapshot: Snapshot) -> None:
        path = report_path(snapshot.recorder)
        if path:
            write_or_warn(path, lambda at: self.write_report(snapshot, at))

    def write_report(self, snapshot: Snapshot, path: str) -> None:
        """The report of ``snapshot``, written atomically to ``path``."""
        write_atomic(build_report(snapshot.recorder), path)

    def registered(self, recorder: Recorder, record: GraphRecord | UninstrumentedGraph
                   ) -> None:
        if not self._started:
            self._started = True
            self._write_started_file(recorder)

    def after_fork(self, recorder: Recorder) -> None:
        if self._started:  # a child of its own: its started-file
            self._write_started_file(recorder)

    @staticmethod
    def _write_started_file(rec: Recorder) -> None:
        """``OUT/fxflops-HOST-PID.started``: this process records here, so that a report it
        never wrote (killed before its first flush) is named missing, not just absent."""
        out = config.OUT.get()
        if not out:
            return
        info = {"pid": os.getpid(), "host": socket.gethostname(), "run": rec.run_id,
                "started": rec.started, "argv": sys.argv[:8]}
        try:
            atomic_text(json.dumps(info), os.path.join(out, started_filename()))
        except OSError as e:  # the report's own write will say what is wrong with OUT
            log.debug("fxflops: no started-file in %s (%s)", out, e)


class PeriodicFlush(Sink):
    """At the first graph: the environment checked, the exit and signal hooks (where any
    sink writes), and the daemon thread that flushes and logs."""

    def __init__(self, rec: Recorder) -> None:
        self.recorder = rec
        self._started = False
        self._last_flush: float | None = None
        self._flush_gap = 0.0
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def registered(self, recorder: Recorder, record: GraphRecord | UninstrumentedGraph
                   ) -> None:
        self._start()

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        config.warn_unknown_variables()
        if any(s.writes() for s in list(self.recorder.sinks)):
            lifecycle.install_exit_hooks()
        flush_s, log_s = config.FLUSH_S.get(), config.LOG_INTERVAL.get()
        if self._thread is None and (flush_s > 0 or log_s > 0):
            self._thread = threading.Thread(target=self._background, args=(flush_s, log_s),
                                            name="fxflops-flush", daemon=True)
            with stop_signals_blocked():
                self._thread.start()

    def _background(self, flush_s: float, log_s: float) -> None:
        """Flush every ``flush_s`` and log every ``log_s`` seconds, at most ``_DUTY`` of the
        time: a flush that took t seconds waits at least t / _DUTY before the next, so a
        report of thousands of sizes is written less often instead of slowing the host."""
        period = min(x for x in (flush_s, log_s) if x > 0)
        last_log = time.monotonic()
        if self._last_flush is None:
            self._last_flush, self._flush_gap = last_log, flush_s
        while not self._stopped.wait(period):
            now = time.monotonic()
            if flush_s > 0 and now - self._last_flush >= self._flush_gap:
                started = time.thread_time()
                self.recorder.flush()
                # the flush's own CPU time (not the wall time it spent waiting for the GIL)
                took = time.thread_time() - started
                self._last_flush = time.monotonic()
                self._flush_gap = max(flush_s, took / _DUTY)
            if log_s > 0 and now - last_log >= log_s:
                try:
                    log.info(log_line(self.recorder))
                except Exception as e:
                    warn_once("log-line", "fxflops: no periodic log line (%s: %s)",
                              type(e).__name__, e)
                last_log = now

    def stop(self) -> None:
        """End the background thread (the report is not written again by it)."""
        self._stopped.set()

    def after_fork(self, recorder: Recorder) -> None:
        self._thread, self._stopped, self._last_flush = None, threading.Event(), None
        if self._started:  # a child of its own: its thread
            self._started = False
            self._start()
