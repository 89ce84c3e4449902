"""The recording session: the store (``recording.store.Recorder``) and its outputs, and the
process's lifecycle around them.

- outputs: rows (``stats``), the report (``to_dict``, ``save``, and ``flush`` to
  ``$FXFLOPS_OUT``), the Prometheus counters' files, the periodic log line; written on a
  daemon thread every ``FXFLOPS_FLUSH_S`` seconds, at exit, and at SIGTERM/SIGINT, never in
  the hot path;
- signals: the report is written, then the host's handler runs as before (or the default
  action). Nothing here is imported on the signal path (every module it uses is imported
  with this one), it never waits for a lock (a flush another thread is writing is left to
  it, and the report written beside it: both are whole files), and what the host's handler
  raises reaches the host: fxflops catches only its own errors;
- threads: hooks are installed from any thread (signals from the main thread, when it next
  runs Python);
- fork: a child starts with empty counts, its own started-file and its own flush thread; a
  multiprocessing child (which ends with ``os._exit``) writes its report at its exit.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from fxflops import config
from fxflops.outputs import dumps as dump
from fxflops.outputs import prometheus as metrics
from fxflops.recording import store
from fxflops.recording.store import Recorder
from fxflops.report.build import build_report
from fxflops.report.figures import graph_rows
from fxflops.report.files import report_filename, started_filename, write_atomic
from fxflops.report.peaks import process_peak
from fxflops.util import atomic_text, forget_warnings, stop_signals_blocked, warn_once

log = logging.getLogger(__name__)

# the share of the time the background thread may spend writing reports
_DUTY = 0.01


class Session(Recorder):
    """The process's recorder, with its outputs (``fxflops.recorder()`` is this)."""

    def __init__(self) -> None:
        super().__init__()
        # one writer at a time; a signal handler only ever tries it
        self._flush_lock = threading.Lock()
        self._flushing = threading.local()  # .now: this thread is in flush()
        self._pending_signal: int | None = None  # arrived during a flush on its thread
        self._last_flush: float | None = None
        self._flush_gap = 0.0
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._outputs = False

    # --- reading ----------------------------------------------------------------------

    def stats(self) -> list[dict[str, Any]]:
        """Per graph and size: calls, median, FLOPs, rates (what the report's rows say)."""
        collect_samples()
        peak = process_peak(self.info)
        return [row for g in self.graphs_snapshot() for row in graph_rows(g, peak)]

    def to_dict(self) -> dict[str, Any]:
        collect_samples()
        return build_report(self)

    def save(self, path: str | os.PathLike[str]) -> str:
        return write_atomic(self.to_dict(), path)

    def log_line(self) -> str:
        parts = []
        for row in self.stats():
            parts.append(f"({row['graph']}, {row['size']}, {row['calls']}, "
                         f"{row['median_ms']:.3f}, {row['gflops']:.2f}, "
                         f"{(row['tflops'] or 0) * 1e3:.1f})")
        return ("fxflops stats (graph, size, calls, median_ms, GFLOPs, GFLOP/s): ["
                + ", ".join(parts) + "]")

    def register_prometheus(self, registry: Any = None) -> Any:
        """Serve this recorder's counters from a ``prometheus_client`` registry (default:
        its global one), read from the rows at each scrape. Returns the collector."""
        if registry is None:
            from prometheus_client import REGISTRY as registry
        collector = metrics.RecorderCollector(self)
        registry.register(collector)
        return collector

    # --- writing --------------------------------------------------------------------

    def default_path(self) -> str | None:
        out = config.OUT.get()
        return os.path.join(out, report_filename(self.info)) if out else None

    def flush(self, final: bool = False) -> None:
        """Write the report to ``$FXFLOPS_OUT`` (and the dumps of sizes new since the last
        flush), and with ``FXFLOPS_PROMETHEUS`` the counters' files. CUDA-event samples still
        in flight are waited for first (on this thread: the host's never waits); ``final``
        (at exit): CUDA-graph replays too. A full disk or a bad folder is warned about once;
        what a signal handler of the host's raises meanwhile reaches the host."""
        path = self.default_path()
        metrics_dir = _metrics_dir()
        if not (path or metrics_dir) or not self._has_data():
            return
        if not self._flush_lock.acquire(blocking=not getattr(self._flushing, "signal", False)):
            # another thread is writing (a signal arrived meanwhile): the report beside its
            if path:
                self._try(path, self._write_report_only)
            return
        self._flushing.now = True
        try:
            collect_samples(wait=True, final=final,
                            in_signal=getattr(self._flushing, "signal", False))
            for where, write in ((path, self._write_report), (metrics_dir, self._write_metrics)):
                if where:
                    self._try(where, write)
        finally:
            self._flushing.now = False
            self._flush_lock.release()
            pending, self._pending_signal = self._pending_signal, None
        if pending is not None:  # a signal that came during the flush: now it acts
            _continue_signal(pending, None)

    def _has_data(self) -> bool:
        return bool(self.graphs or self.uninstrumented or self.forwards)

    def _try(self, where: str, write: Callable[[str], Any]) -> None:
        try:
            write(where)
        except Exception as e:  # never let reporting break the process...
            if host_raised(e):  # ...but what the host raised is the host's
                raise
            warn_once(f"flush:{where}:{type(e).__name__}", "fxflops: could not write %s (%s: "
                      "%s); will try again at the next flush", where, type(e).__name__, e)

    def _write_report(self, path: str) -> None:
        try:  # the per-size dumps; a bad OUT/graphs must not stop the report
            for g in self.graphs_snapshot():
                dump.dump_sizes(g)
        except Exception as e:
            if host_raised(e):
                raise
            warn_once(f"dumps:{type(e).__name__}", "fxflops: no per-size graph dumps (%s: %s)",
                      type(e).__name__, e)
        self._write_report_only(path)

    def _write_report_only(self, path: str) -> None:
        write_atomic(build_report(self), path)

    def _write_metrics(self, directory: str) -> None:
        metrics.write_files(self, directory)
        # FXFLOPS_PROMETHEUS_PORT: this node's exporter, if no process of the node serves
        # it yet (one bind attempt per flush, never on the hot path)
        metrics.serve_node(directory)

    # --- the process around it ------------------------------------------------------

    def registered(self, record: Any) -> None:
        self._start_outputs()

    def _start_outputs(self) -> None:
        """At the first graph: the environment checked, the exit, signal and fork hooks,
        the started-file, the periodic flush and log."""
        if self._outputs:
            return
        self._outputs = True
        config.warn_unknown_variables()
        if config.OUT.get() or _metrics_dir():
            atexit.register(_flush_current)
            hook_signals()
            self._write_started_file()
        flush_s, log_s = config.FLUSH_S.get(), config.LOG_INTERVAL.get()
        if self._thread is None and (flush_s > 0 or log_s > 0):
            self._thread = threading.Thread(target=self._background, args=(flush_s, log_s),
                                            name="fxflops-flush", daemon=True)
            with stop_signals_blocked():
                self._thread.start()

    def _write_started_file(self) -> None:
        """``OUT/fxflops-HOST-PID.started``: this process records here, so that a report it
        never wrote (killed before its first flush) is named missing, not just absent."""
        out = config.OUT.get()
        if not out:
            return
        info = {"pid": os.getpid(), "host": socket.gethostname(), "run": self.run_id,
                "started": self.started, "argv": sys.argv[:8]}
        try:
            atomic_text(json.dumps(info), os.path.join(out, started_filename()))
        except OSError as e:  # the report's own write will say what is wrong with OUT
            log.debug("fxflops: no started-file in %s (%s)", out, e)

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
                self.flush()
                # the flush's own CPU time (not the wall time it spent waiting for the GIL)
                took = time.thread_time() - started
                self._last_flush = time.monotonic()
                self._flush_gap = max(flush_s, took / _DUTY)
            if log_s > 0 and now - last_log >= log_s:
                try:
                    log.info(self.log_line())
                except Exception as e:
                    warn_once("log-line", "fxflops: no periodic log line (%s: %s)",
                              type(e).__name__, e)
                last_log = now

    def stop(self) -> None:
        """End the background thread (the report is not written again by it)."""
        self._stopped.set()

    def after_fork(self) -> None:
        super().after_fork()
        self._flush_lock = threading.Lock()
        self._flushing = threading.local()
        self._pending_signal = None
        self._thread, self._stopped, self._last_flush = None, threading.Event(), None
        if self._outputs:  # a child of its own: its started-file, its thread
            self._outputs = False
            self._start_outputs()


def _metrics_dir() -> str | None:
    """Where the Prometheus counters' files go (None: not asked for, or nowhere to go)."""
    if not config.PROMETHEUS.get():
        return None
    where = metrics.files_dir()
    if where is None:
        warn_once("prometheus-nowhere", "fxflops: FXFLOPS_PROMETHEUS=1 but nowhere to write "
                  "the counters: set FXFLOPS_PROMETHEUS_PORT (this node's exporter), "
                  "PROMETHEUS_MULTIPROC_DIR or FXFLOPS_PROMETHEUS_DIR, or "
                  "serve them with fxflops.recorder().register_prometheus()")
    return where


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
    wait up to ``DEVICE_WAIT_S`` for those in flight; ``final``: the last replays' too).
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


# --- host exceptions ----------------------------------------------------------------------

_HOST = "_fxflops_host_raised"


def host_raised(error: BaseException) -> bool:
    """Whether ``error`` came from the host's signal handler (fxflops must let it through)."""
    return getattr(error, _HOST, False)


# --- exit, signals, fork --------------------------------------------------------------------


def _flush_current() -> None:
    rec = store.current()
    if isinstance(rec, Session):
        rec.flush(final=True)


def _at_multiprocessing_exit(mp_util: Any) -> None:
    """A multiprocessing child started by fork ends with ``os._exit`` (no atexit): its
    report is written by multiprocessing's exit hook (which runs its finalizers)."""
    mp_util.Finalize(None, _flush_current, exitpriority=100)


_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_HOOKED: dict[int, Any] = {}  # signal -> the handler it had before fxflops'
_PENDING_CALL: Any = None  # kept alive while the main thread has not run it


def hook_signals() -> None:
    """SIGTERM and SIGINT write the report, then do what they did before. Signal handlers
    can only be set from the main thread: from another, they are set when the main thread
    next runs Python (a pending call)."""
    if _HOOKED:
        return
    if threading.current_thread() is threading.main_thread():
        _install_signal_handlers()
        return
    global _PENDING_CALL
    import ctypes

    def on_main_thread(_: Any) -> int:
        try:
            _install_signal_handlers()
        except Exception as e:  # must not raise into the interpreter
            warn_once("signals", "fxflops: no report at a signal (%s)", e)
        return 0

    _PENDING_CALL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(on_main_thread)
    if ctypes.pythonapi.Py_AddPendingCall(_PENDING_CALL, None) != 0:
        warn_once("signals", "fxflops: no report at a signal (the first graph was compiled "
                  "off the main thread, which could not be reached)")


def _install_signal_handlers() -> None:
    if _HOOKED:
        return
    for signum in _SIGNALS:
        try:
            previous = signal.getsignal(signum)
            if previous is signal.SIG_IGN or previous is None:
                continue  # ignored (or set outside Python): leave it so
            _HOOKED[signum] = previous
            signal.signal(signum, _on_signal)
        except (ValueError, OSError) as e:
            warn_once(f"signal:{signum}", "fxflops: no report on signal %s (%s)", signum, e)
    _watch_sigterm()


def _on_signal(signum: int, frame: Any) -> Any:
    if signum == signal.SIGTERM:
        _TERM_STARTED[0] = time.monotonic()
    rec = store.current()
    if isinstance(rec, Session):
        if getattr(rec._flushing, "now", False):
            # interrupted its own flush: let it finish, then act (see Session.flush)
            rec._pending_signal = signum
            return None
        rec._flushing.signal = True
        try:
            rec.flush(final=True)
        finally:
            rec._flushing.signal = False
    return _continue_signal(signum, frame)


def _continue_signal(signum: int, frame: Any) -> Any:
    """What the signal did before fxflops: the host's handler (what it raises is marked as
    the host's), or the default action (the handler restored and the signal raised again)."""
    previous = _HOOKED.get(signum, signal.SIG_DFL)
    if callable(previous):
        try:
            return previous(signum, frame)
        except BaseException as e:
            try:
                setattr(e, _HOST, True)
            except Exception:  # an exception that takes no attributes
                pass
            raise
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return None


# --- a SIGTERM Python did not act on ---------------------------------------------------------
# Where SIGTERM's action was the default (the process ends at once), fxflops' handler makes
# it a Python handler, which runs when the main thread next runs Python. A main thread that
# the signal wakes in C can miss it under load (seen: a multiprocessing worker waiting on
# its queue's lock, terminated by Pool.terminate): the handler never runs, the process never
# ends. A watcher sees each SIGTERM arrive (Python's signal wakeup fd, where the host has
# none) and, if the handler has not started within a second, sends it again to the main
# thread (at most three times).

_TERM_STARTED = [0.0]  # when _on_signal last started on SIGTERM (time.monotonic)
_WAKEUP: list[int] = []  # the watcher's pipe (read end, write end), while fxflops owns it


def _watch_sigterm() -> None:
    """(On the main thread.) Watch SIGTERM where fxflops made it a Python handler."""
    if _WAKEUP or _HOOKED.get(signal.SIGTERM) != signal.SIG_DFL:
        return
    try:
        read_fd, write_fd = os.pipe()
    except OSError:
        return
    try:
        os.set_blocking(write_fd, False)
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (OSError, ValueError):
        os.close(read_fd)
        os.close(write_fd)
        return
    if previous != -1:  # the host's (an event loop's): it stays the host's, unwatched
        signal.set_wakeup_fd(previous, warn_on_full_buffer=False)
        os.close(read_fd)
        os.close(write_fd)
        return
    _WAKEUP[:] = [read_fd, write_fd]
    watcher = threading.Thread(target=_sigterm_watcher, args=(read_fd,),
                               name="fxflops-sigterm", daemon=True)
    with stop_signals_blocked():
        watcher.start()


def _sigterm_watcher(read_fd: int) -> None:
    main = threading.main_thread()
    while True:
        try:
            arrived_signals = os.read(read_fd, 512)
        except OSError:
            return
        if not arrived_signals:
            return
        if signal.SIGTERM not in arrived_signals:
            continue
        arrived = time.monotonic()
        for _ in range(3):
            time.sleep(1.0)
            if _TERM_STARTED[0] >= arrived - 1.0 or not main.is_alive() or \
                    signal.getsignal(signal.SIGTERM) is not _on_signal:
                break  # acted on (or no longer fxflops' to act on)
            try:
                signal.pthread_kill(main.ident or 0, signal.SIGTERM)
            except (OSError, ValueError):
                return
        _drain(read_fd)  # the echoes of what was sent again


def _drain(fd: int) -> None:
    try:
        os.set_blocking(fd, False)
        while os.read(fd, 512):
            pass
    except OSError:  # BlockingIOError: nothing more
        pass
    finally:
        try:
            os.set_blocking(fd, True)
        except OSError:
            pass


def _after_fork_in_child() -> None:
    if _WAKEUP:  # the parent's pipe: the child watches its own
        for fd in _WAKEUP:
            os.close(fd)
        _WAKEUP.clear()
        try:
            signal.set_wakeup_fd(-1)
        except ValueError:
            pass
        else:
            _watch_sigterm()
    rec = store.current()
    if rec is None:
        return
    rec.after_fork()
    # a multiprocessing child clears the finalizers it inherited, then runs its after-fork
    # callbacks: the exit hook is registered there
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        mp_util.register_after_fork(rec, lambda _: _at_multiprocessing_exit(mp_util))


_FORK_HOOK: list[bool] = []


def _new_session() -> Session:
    """The process's first session installs the fork hook (never at import)."""
    if not _FORK_HOOK:
        _FORK_HOOK.append(True)
        os.register_at_fork(after_in_child=_after_fork_in_child)
    return Session()


def _is_session(rec: Recorder) -> bool:
    return isinstance(rec, Session)


def recorder() -> Session:
    """The process-wide recorder: graphs, rows, and their outputs (made at first use)."""
    rec = store.current()
    if not isinstance(rec, Session):
        rec = store.current_or_make(_new_session, _is_session)
    assert isinstance(rec, Session)
    return rec


def reset_recorder() -> Session:
    """Start over as a fresh process would: a new, empty recorder (graphs compiled before
    keep recording into their old records, which no report shows), warnings shown again."""
    old = store.replace_recorder()
    if isinstance(old, Session):
        old.stop()
    forget_warnings()
    return recorder()
