"""Ports for the servers the tests start, picked where no other socket lands by chance.

A port found free by binding port 0 is one of the kernel's ephemeral ports
(``ip_local_port_range``). Released, it can be handed out again to any process that binds
port 0 or connects: gloo's listeners, vLLM's ZMQ sockets and torch's stores all do. If one
takes it before the server the test meant it for, that server finds it taken, and a client
reaches whatever took it (a gloo listener accepts a scrape and never answers it). So the
tests' ports come from outside that range, which no port-0 bind reaches, each checked free
and handed out once per test session.
"""

from __future__ import annotations

import random
import socket

_given: set[int] = set()
# not the global generator: pytest-randomly reseeds it alike before every test
_pick = random.Random()


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _bindable(port: int) -> bool:
    """Free on every address (no listener, no connection, nothing in TIME_WAIT)."""
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A free port outside the ephemeral range, not handed out before in this session:
    below it (and below 30000, where Kubernetes' node ports start), else above it; where
    the range leaves no room, one the kernel picks (the old race, on such hosts only)."""
    low, high = _ephemeral_range()
    top = min(low, 30000)
    below, above = range(max(1024, top - 10000), top), range(high + 1, 65536)
    candidates = max(below, above, key=len)
    if len(candidates) < 100:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    for _ in range(1000):
        port = _pick.choice(candidates)
        if port not in _given and _bindable(port):
            _given.add(port)
            return port
    raise RuntimeError(f"no free port in {candidates}")
