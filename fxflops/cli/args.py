"""The CLI's argument types: each refuses a bad value with a one-line reason."""

from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not at least 1")
    return value


def non_negative_float(text: str) -> float:
    """A finite number from 0 (float() also reads "nan" and "inf": every comparison with
    nan is false, so a nan threshold would pass nothing, and silently)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a finite number from 0")
    return value


