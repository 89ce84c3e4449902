"""This host's peak cache: what was measured of its devices, kept for later runs.

One JSON file per host, ``$XDG_CACHE_HOME/fxflops/peak-HOST.json`` (``~/.cache`` by
default), mapping a device's name (``peaks.device_name``) to what was measured of it:
``fxflops peak --measure``'s GEMMs and copy (``tflops``, ``gbps``, ``measured_at``) and a
CPU's memory bandwidth (``bandwidth``: ``cpu_bandwidth``).

Written atomically (a temporary file renamed over the old one): a reader sees the old file
or the new one, never half of one. Two processes that measure at once serialise on a lock
file beside it (``locked``), so the second reads what the first measured. A file that is
not a cache (hand-edited, truncated by a full disk, another version's) is warned about
once and written over: a cache never stops a run.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator
from typing import Any

from fxflops.util import atomic_text, warn_once


def cache_path() -> str:
    """Where this host's peaks are kept: ``$XDG_CACHE_HOME/fxflops/peak-HOST.json``."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "fxflops", f"peak-{socket.gethostname()}.json")


def read_cache() -> dict[str, Any]:
    """The cache's entries by device name; empty where there is no file yet, or where the
    file is not a cache (warned about once)."""
    path = cache_path()
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        warn_once(f"peak-cache:{path}", "fxflops: the peak cache %s cannot be read (%s); "
                  "measuring again and writing it over", path, e)
        return {}
    if not isinstance(data, dict):
        warn_once(f"peak-cache:{path}", "fxflops: the peak cache %s holds %s, not an object "
                  "of devices; measuring again and writing it over", path, type(data).__name__)
        return {}
    return data


def device_entry(device: str) -> dict[str, Any] | None:
    """What was kept of ``device`` (an object), else None."""
    entry = read_cache().get(device)
    return entry if isinstance(entry, dict) else None


def update_device(device: str, fields: dict[str, Any], replace: bool = False) -> str:
    """Keep ``fields`` in ``device``'s entry (``replace``: as its whole entry), the other
    devices' entries as they were; returns the cache's path. Raises OSError where the
    cache cannot be written."""
    data = read_cache()
    old = data.get(device)
    data[device] = {**(old if isinstance(old, dict) and not replace else {}), **fields}
    return atomic_text(json.dumps(data, indent=1), cache_path())


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Hold the cache's lock (a file beside it, ``flock``): one process measures while the
    others wait, then read what it kept. Where no lock can be taken (no ``fcntl``, a
    read-only cache folder), the block runs unlocked: at worst two processes measure."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        yield
        return
    path = cache_path() + ".lock"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):  # a file system without locks: unlocked
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (closing releases the lock)
