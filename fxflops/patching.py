"""Wrap a method of a library's class once, however often an installer runs, and undo it.

Like depyf's patches: ``patch_method`` returns a :class:`Patch`, which undoes itself
(``patch.undo()``, or on leaving ``with patch_method(...):``). Patches of different tags
stack; each wrapper carries the tags beneath it, so a second install of any is a no-op.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any


class Patch:
    """One applied wrapper; ``undo()`` puts back what was there (a no-op if not applied)."""

    def __init__(self, owner: Any, name: str, original: Any, wrapper: Any | None) -> None:
        self.owner, self.name, self.original, self.wrapper = owner, name, original, wrapper

    @property
    def applied(self) -> bool:
        return self.wrapper is not None

    def undo(self) -> None:
        if self.wrapper is None:
            return
        if self.owner.__dict__.get(self.name) is self.wrapper:
            # put back exactly what the class held: its own attribute, or none (inherited)
            if self.original is _INHERITED:
                delattr(self.owner, self.name)
            else:
                setattr(self.owner, self.name, self.original)
        self.wrapper = None

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.undo()


_INHERITED = object()


def patch_method(owner: Any, name: str, tag: str,
                 make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Patch:
    """Replace ``owner.name`` by ``make_wrapper(original)`` unless ``tag`` is already applied.

    Returns the :class:`Patch` (``.applied`` is False when the tag was already there).
    """
    original = getattr(owner, name)
    tags: frozenset[str] = getattr(original, "_fxflops_tags", frozenset())
    if tag in tags:
        return Patch(owner, name, original, None)
    own = owner.__dict__.get(name, _INHERITED) if isinstance(owner, type) else original
    wrapper: Any = make_wrapper(original)
    wrapper._fxflops_tags = tags | {tag}
    wrapper._fxflops = True  # any fxflops wrapper says so
    setattr(owner, name, wrapper)
    return Patch(owner, name, own, wrapper)


def subclasses(cls: type) -> list[type]:
    """``cls`` and every class below it (those defined so far): where a method a library
    class defines may be overridden, to patch each definition."""
    out, todo = [], [cls]
    while todo:
        c = todo.pop()
        out.append(c)
        todo += c.__subclasses__()
    return out
