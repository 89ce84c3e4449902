"""Small helpers every layer uses: warn once, write a file atomically, format a quantity."""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

log = logging.getLogger(__name__)
_warned: set[str] = set()


def warn_once(key: str, msg: str, *args: Any) -> None:
    """Log ``msg`` at WARNING the first time ``key`` is seen in this process."""
    if key not in _warned:
        _warned.add(key)
        log.warning(msg, *args)


def forget_warnings() -> None:
    """Warn again about everything (a fresh process, as far as warnings go)."""
    _warned.clear()


def atomic_text(text: str, path: str | os.PathLike[str]) -> str:
    """Write to a temporary file beside ``path`` and rename it: readers never see half."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".fxflops-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
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
