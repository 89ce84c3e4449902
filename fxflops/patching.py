"""Wrap a method of a library's class once, however often an installer runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def patch_method(owner: Any, name: str, tag: str,
                 make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Replace ``owner.name`` by ``make_wrapper(original)`` unless ``tag`` is already applied.

    Wrappers of different tags stack; each wrapper carries the tags beneath it, so a second
    install of any of them is a no-op. Returns whether it patched.
    """
    original = getattr(owner, name)
    tags = getattr(original, "_fxflops_tags", frozenset())
    if tag in tags:
        return False
    wrapper = make_wrapper(original)
    wrapper._fxflops_tags = tags | {tag}  # type: ignore[attr-defined]
    wrapper._fxflops = True  # type: ignore[attr-defined]  (any fxflops wrapper says so)
    setattr(owner, name, wrapper)
    return True


def is_patched(owner: Any, name: str, tag: str) -> bool:
    return tag in getattr(getattr(owner, name), "_fxflops_tags", frozenset())
