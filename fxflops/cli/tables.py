"""Number formatting shared by the CLI tables."""

from __future__ import annotations

import sys

from rich.console import Console

from fxflops.util import human


def make_console() -> Console:
    """Wide enough for the tables when output goes to a file or a CI log."""
    return Console(width=None if sys.stdout.isatty() else 180)


def fmt_num(x: float | int | None) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def fmt_bytes(n: float | int | None) -> str:
    return human(n, "B")


def fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"
