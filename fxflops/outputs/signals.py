"""SIGTERM and SIGINT: the report is written, then the host's handler runs as before (or
the default action).

Nothing here is imported on the signal path (every module it uses is imported with this
one), it never waits for a lock (a flush another thread is writing is left to it, and the
report written beside it: both are whole files), and what the host's handler raises
reaches the host: fxflops catches only its own errors (``util.host_raised``). Handlers are
set from any thread: from the main thread directly, from another when the main thread next
runs Python (a pending call). Where SIGTERM's action was the default, a watcher thread sends
again a SIGTERM that Python did not act on.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from fxflops.recording.recorder import current
from fxflops.util import mark_host_raised, stop_signals_blocked, warn_once

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
    rec = current()
    if rec is not None:
        if rec.flushing_here():
            # interrupted its own flush: let it finish, then act (see Recorder.flush)
            rec.defer(lambda: _continue_signal(signum, None))
            return None
        rec.flush(final=True, in_signal=True)
    return _continue_signal(signum, frame)


def _continue_signal(signum: int, frame: Any) -> Any:
    """What the signal did before fxflops: the host's handler (what it raises is marked as
    the host's), or the default action (the handler restored and the signal raised again)."""
    previous = _HOOKED.get(signum, signal.SIG_DFL)
    if callable(previous):
        try:
            return previous(signum, frame)
        except BaseException as e:
            mark_host_raised(e)
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


def after_fork_in_child() -> None:
    """(In a forked child.) The parent's wakeup pipe closed: the child watches its own."""
    if _WAKEUP:
        for fd in _WAKEUP:
            os.close(fd)
        _WAKEUP.clear()
        try:
            signal.set_wakeup_fd(-1)
        except ValueError:
            pass
        else:
            _watch_sigterm()
