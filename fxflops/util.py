"""Small helpers every layer uses: warn once, write a file atomically (or through a link,
FIFO or device the user named), format a quantity, tell the host's exceptions from
fxflops' own."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from typing import Any

log = logging.getLogger(__name__)
_warned: set[str] = set()


@contextlib.contextmanager
def stop_signals_blocked() -> Any:
    """Threads started inside take SIGTERM and SIGINT blocked (a thread inherits its
    creator's mask). POSIX lets a signal sent to the process land on any thread that does
    not block it; Python runs handlers on the main thread only, so one that landed on
    fxflops' thread while the main thread waits in C would wake nothing there."""
    import signal

    stop = {signal.SIGTERM, signal.SIGINT}
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    except (AttributeError, OSError, ValueError):  # no pthread signal masks here
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def warn_once(key: str, msg: str, *args: Any) -> None:
    """Log ``msg`` at WARNING the first time ``key`` is seen in this process."""
    if key not in _warned:
        _warned.add(key)
        log.warning(msg, *args)


# set on an exception a host's signal handler raised (``outputs.signals``): what the host
# raised is the host's, and no ``except Exception`` of fxflops' may swallow it (the hot path
# reads this attribute by name too)
HOST_RAISED = "_fxflops_host_raised"


def host_raised(error: BaseException) -> bool:
    """Whether ``error`` came from the host's signal handler (fxflops must let it through)."""
    return getattr(error, HOST_RAISED, False)


def mark_host_raised(error: BaseException) -> None:
    """Mark ``error`` as the host's (raised by its signal handler while fxflops ran)."""
    try:
        setattr(error, HOST_RAISED, True)
    except Exception:  # an exception that takes no attributes
        pass


def write_or_warn(where: str, write: Any) -> None:
    """``write(where)``, a file or folder of fxflops' outputs: what fails is warned about
    once (a full disk, a bad folder: tried again at the next flush), never raised, except
    what the host's signal handler raised meanwhile, which is the host's."""
    try:
        write(where)
    except Exception as e:  # never let reporting break the process...
        if host_raised(e):  # ...but what the host raised is the host's
            raise
        warn_once(f"flush:{where}:{type(e).__name__}", "fxflops: could not write %s (%s: "
                  "%s); will try again at the next flush", where, type(e).__name__, e)


def forget_warnings() -> None:
    """Warn again about everything (a fresh process, as far as warnings go)."""
    _warned.clear()


def _temp_beside(path: str) -> tuple[int, str]:
    """A new empty file in ``path``'s folder, made as ``open(path, "w")`` makes a file:
    mode 0o666 less the umask. (``mkstemp`` makes 0o600 whatever the umask; the kernel
    applying the umask here needs no read of it, which would race other threads.)"""
    directory = os.path.dirname(os.path.abspath(path))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = os.path.join(directory, f".fxflops-{os.urandom(8).hex()}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"{directory}: no free temporary file name")


def _replace(path: str, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it over ``path``:
    readers see the old file or the new one, never half. ``mode``: the new file's."""
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_text(text: str, path: str | os.PathLike[str]) -> str:
    """fxflops' own files (reports, dumps): written atomically, the folder made if need be;
    the file's mode follows the umask."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    _replace(path, text.encode("utf-8"))
    return path


def write_output(path: str | os.PathLike[str], data: str | bytes) -> str:
    """A file the user named (``--json``, ``--csv``, ``-o``), written as a shell's ``>``
    would, but atomically where that is possible.

    A regular file, or none yet: temporary file and rename (an existing file keeps its
    mode; a new one follows the umask). Anything else there (a symlink, a FIFO, a device
    such as ``/dev/stdout``) is opened and written through: replacing it would break the
    link, starve the FIFO's reader, or put a file where a device node was. A FIFO's write
    waits for its reader, as ``>`` does.
    """
    path = os.fspath(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        st: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        with open(path, "wb") as f:  # a folder: IsADirectoryError, one line in the CLI
            f.write(payload)
        return path
    if st is None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    _replace(path, payload, stat.S_IMODE(st.st_mode) if st is not None else None)
    return path


def human(n: float | None, unit: str = "") -> str:
    """``1.23 GFLOP``, ``4.5 MB``: three significant digits, SI prefixes."""
    if n is None:
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}{unit}"
    return f"{n:.3g} {unit}".rstrip()


def meta_value(node: Any) -> Any:
    """The example value FX keeps for a node (``meta["val"]`` after AOTAutograd,
    ``meta["example_value"]`` in Dynamo's graph); anything that is not a node, as is."""
    meta = getattr(node, "meta", None)
    if not isinstance(meta, dict):
        return node
    return meta.get("val", meta.get("example_value"))
