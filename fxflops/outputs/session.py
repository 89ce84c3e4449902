"""The session: the process's recorder with its outputs attached, and the handle
``fxflops.recorder()`` returns.

``attach(recorder)`` subscribes the default sinks to a recorder, once (the graph dumps of
new sizes, the report files, the Prometheus files, the periodic flush), and installs the
process's fork hook; it is called by the layers above where a recorder starts being used
(``instrument.plan``'s registrations, ``fxflops.recorder()``), never at import. The handle
reads the recorder in the report's terms (``stats``, ``to_dict``, ``save``, the Prometheus
collector) and flushes it; every other attribute is the recorder's own
(``recording.recorder.Recorder``: ``graphs``, ``info``, ``register``, ...).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from fxflops.outputs import lifecycle
from fxflops.outputs import prometheus as metrics
from fxflops.outputs.dumps import SizeDumps
from fxflops.outputs.report_files import PeriodicFlush, ReportFiles, log_line, report_path
from fxflops.recording import recorder as recording
from fxflops.recording.recorder import Recorder
from fxflops.report.build import build_report, recorder_rows
from fxflops.report.files import write_atomic
from fxflops.report.schema import GraphRow

_ATTACHING = threading.Lock()


def attach(rec: Recorder) -> Recorder:
    """Subscribe the default sinks to ``rec`` (once per recorder; in the order they write:
    the per-size dumps, the report, the Prometheus files; then the periodic flush), and
    install the process's fork hook (once per process). Returns ``rec``."""
    if rec.sink(PeriodicFlush) is not None:
        return rec
    with _ATTACHING:
        if rec.sink(PeriodicFlush) is None:
            lifecycle.install_fork_hook()
            for sink in (SizeDumps(), ReportFiles(), metrics.PrometheusFiles(),
                         PeriodicFlush(rec)):
                rec.subscribe(sink)
    return rec


class Session:
    """``fxflops.recorder()``: the process's recorder, read and written in the report's
    terms. Attributes it does not define are the recorder's."""

    def __init__(self, rec: Recorder) -> None:
        self.recorder = rec

    @property
    def files(self) -> ReportFiles:
        """The report-files sink (``outputs.report_files``)."""
        return self.recorder.sink(ReportFiles)

    # --- reading ----------------------------------------------------------------------

    def stats(self) -> list[GraphRow]:
        """Per graph and size: calls, median, FLOPs, rates (what the report's rows say)."""
        self.recorder.settle()
        return recorder_rows(self.recorder)

    def to_dict(self) -> dict[str, Any]:
        """The report (schema ``fxflops.report/1``), as ``$FXFLOPS_OUT`` would hold it."""
        self.recorder.settle()
        return build_report(self.recorder)

    def save(self, path: str | os.PathLike[str]) -> str:
        """The report, written atomically to ``path``."""
        return write_atomic(self.to_dict(), path)

    def log_line(self) -> str:
        self.recorder.settle()
        return log_line(self.recorder)

    def register_prometheus(self, registry: Any = None) -> Any:
        """Serve this recorder's counters from a ``prometheus_client`` registry (default:
        its global one), read from the rows at each scrape. Returns the collector."""
        if registry is None:
            from prometheus_client import REGISTRY as registry
        collector = metrics.RecorderCollector(self.recorder)
        registry.register(collector)
        return collector

    # --- writing --------------------------------------------------------------------

    def default_path(self) -> str | None:
        """Where a flush writes the report (``$FXFLOPS_OUT``; None: nowhere)."""
        return report_path(self.recorder)

    def flush(self, final: bool = False) -> None:
        """Write the report to ``$FXFLOPS_OUT`` (and the dumps of sizes new since the last
        flush), and with ``FXFLOPS_PROMETHEUS`` the counters' files. CUDA-event samples still
        in flight are waited for first (on this thread: the host's never waits); ``final``
        (at exit): CUDA-graph replays too. A full disk or a bad folder is warned about once;
        what a signal handler of the host's raises meanwhile reaches the host."""
        self.recorder.flush(final)

    def reset(self) -> None:
        """Forget every row (the graphs stay registered)."""
        self.recorder.reset()

    def stop(self) -> None:
        """End the background thread (the report is not written again by it)."""
        self.recorder.stop()

    def __getattr__(self, name: str) -> Any:
        if name == "recorder":  # (not set yet: a copy being made)
            raise AttributeError(name)
        return getattr(self.recorder, name)

    def __repr__(self) -> str:
        return f"<fxflops session: {len(self.recorder.graphs)} graphs>"


_HANDLE: list[Session] = []  # the handle of the process's recorder, once asked for


def session() -> Session:
    """The process-wide recorder with its outputs (``fxflops.recorder()``), made and
    attached at first use: its graphs and rows, read and written as the report."""
    rec = attach(recording.recorder())
    handle = _HANDLE[0] if _HANDLE else None
    if handle is None or handle.recorder is not rec:
        with _ATTACHING:
            handle = _HANDLE[0] if _HANDLE else None
            if handle is None or handle.recorder is not rec:
                handle = Session(rec)
                _HANDLE[:] = [handle]
    return handle


def reset_session() -> Session:
    """Start over as a fresh process would (``fxflops.reset_recorder()``): a new, empty
    recorder (graphs compiled before keep recording into their old records, which no
    report shows), warnings shown again."""
    recording.reset_recorder()
    return session()
