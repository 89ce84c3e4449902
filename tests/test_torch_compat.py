"""The private torch APIs fxflops uses (fxflops/torch_compat.py), checked against the
installed torch: every entry resolves (unless optional), and fxflops names no private torch
API that the table does not list, so that an upgrade names the seam to look at."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
import torch

from fxflops import torch_compat

ROOT = Path(__file__).resolve().parents[1]
# a private torch name: a module or attribute whose path has a part starting with "_"
_PRIVATE = re.compile(r"^(torch|functorch)(\.\w+)*$")


def _is_private(dotted: str) -> bool:
    parts = dotted.split(".")
    return parts[0] == "functorch" or (parts[0] == "torch" and any(
        p.startswith("_") and not p.startswith("__") for p in parts[1:]))


@pytest.mark.parametrize("key", sorted(torch_compat.PRIVATES))
def test_each_private_api_resolves_in_this_torch(key):
    entry = torch_compat.PRIVATES[key]
    if entry.optional:
        try:
            torch_compat.get(key)
        except AttributeError:
            pytest.skip(f"{key}: optional, absent from torch {torch.__version__}")
        return
    assert torch_compat.get(key) is not None, key


def test_a_moved_api_is_named_with_the_releases_it_was_checked_against(monkeypatch):
    monkeypatch.setitem(torch_compat.PRIVATES, "gone", torch_compat.Private(
        "torch._inductor.compile_fx", "compile_fx_moved_away", "a test entry"))
    with pytest.raises(AttributeError, match=r"compile_fx_moved_away \(a test entry; fxflops "
                                             r"checked it with torch 2\.11, 2\.13, 2\.14, "
                                             r"2\.15\)"):
        torch_compat.get("gone")


def private_names(path: Path) -> set[str]:
    """The private torch modules and attributes a source file imports or reads."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if _is_private(a.name)}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {f"{node.module}.{a.name}" for a in node.names
                      if _is_private(f"{node.module}.{a.name}")}
        elif isinstance(node, ast.Attribute):
            dotted = ast.unparse(node)
            if _PRIVATE.match(dotted) and _is_private(dotted):
                found.add(dotted)
    return found


def test_fxflops_uses_no_private_torch_api_outside_the_table():
    """Outside torch_compat.py, only the ``direct`` entries' modules are named; every other
    private torch API goes through ``torch_compat.get``."""
    direct = {f"{e.module}.{e.name}".rstrip(".") for e in torch_compat.PRIVATES.values()
              if e.direct}
    modules = {e.module for e in torch_compat.PRIVATES.values() if e.direct and not e.name}
    stray = {}
    for path in sorted((ROOT / "fxflops").rglob("*.py")):
        if path.name == "torch_compat.py":
            continue
        for name in private_names(path):
            if name in direct or name in modules or any(
                    name.startswith(d + ".") for d in direct | modules):
                continue
            if any(d.startswith(name + ".") for d in direct):  # (a prefix: torch._ops)
                continue
            stray.setdefault(str(path.relative_to(ROOT)), set()).add(name)
    assert stray == {}, stray


def test_the_table_names_modules_that_exist():
    for entry in torch_compat.PRIVATES.values():
        if entry.optional:
            continue
        importlib.import_module(entry.module)
