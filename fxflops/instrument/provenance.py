"""Inductor's kernel map, captured while a graph compiles: the provenance mappings it
emits as structured-trace artifacts (a fresh compile or an FX-graph cache hit), and the
Inductor settings that make it emit them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

from fxflops import torch_compat
from fxflops.cost.kernels import _POST_LINE, ARTIFACT, POST_GRAD


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.payloads: list[tuple[str, str]] = []  # (artifact, payload), in order

    def emit(self, record: logging.LogRecord) -> None:
        metadata = getattr(record, "metadata", None)
        name = (metadata.get("artifact") or {}).get("name") if isinstance(metadata, dict) \
            else None
        if name in (ARTIFACT, POST_GRAD):
            payload = getattr(record, "payload", None)
            if payload:
                self.payloads.append((name, payload))


_capture_lock = threading.Lock()


class Capture:
    """The provenance mappings Inductor emitted since the capture began."""

    def __init__(self, collector: _Collector) -> None:
        self._collector = collector

    def maps(self) -> list[dict[str, Any]]:
        """Each mapping, with ``"_post_ops"``: the op of each post-grad node, from the
        post-grad graph Inductor emitted before it."""
        found = []
        ops: dict[str, str] = {}
        for name, payload in list(self._collector.payloads):
            if name == POST_GRAD:
                ops = dict(_POST_LINE.findall(payload))
                continue
            try:
                data = json.loads(payload)
            except ValueError:
                continue
            if isinstance(data, dict):
                found.append({**data, "_post_ops": ops})
        return found


@contextlib.contextmanager
def capture() -> Iterator[Capture]:
    """Collect the provenance mappings Inductor emits inside (one per graph it compiles or
    loads from its cache). Structured tracing only runs while a handler listens: one is
    added here, for the compile only."""
    trace_log = torch_compat.get("trace_log")
    collector = _Collector()
    with _capture_lock:
        trace_log.addHandler(collector)
    try:
        yield Capture(collector)
    finally:
        with _capture_lock:
            trace_log.removeHandler(collector)


@contextlib.contextmanager
def fresh_provenance(backward: bool) -> Iterator[None]:
    """A backward graph is compiled later, alone (inside ``loss.backward()``), outside the
    config the forward's compile had, and with Inductor's provenance globals holding
    another compile's: its own config, and its own globals from empty
    (``torch._inductor.debug.reset_provenance_globals``)."""
    if not backward:
        yield
        return
    try:
        reset = torch_compat.get("reset_provenance_globals")
    except AttributeError:  # (a torch without it: the globals as they are)
        reset = contextlib.nullcontext
    with torch_compat.get("inductor_config").patch(inductor_patches()), reset():
        yield


def inductor_patches() -> dict[str, Any]:
    """Inductor's settings for kernel maps and per-kernel profiler events."""
    return {"trace.provenance_tracking_level": 1, "cpp.enable_kernel_profile": True}


