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
                                             r"checked it with torch 2\.11, 2\.13, 2\.14\)"):
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


def _aot_forward_of_inductor(model: torch.nn.Module, x: torch.Tensor):
    """What ``compile_fx`` returns for ``model`` without gradients, as Dynamo calls it, and
    the arguments Dynamo gave the backend (the parameters among them, lifted)."""
    captured = {}

    def capture(gm, example_inputs):
        captured["inputs"] = list(example_inputs)
        captured["fn"] = torch_compat.get("compile_fx")(gm, example_inputs)
        return captured["fn"]

    compiled = torch.compile(model, backend=capture)
    with torch.no_grad():
        compiled(x)
    return torch_compat.get("innermost_fn")(captured["fn"]), captured["inputs"]


def test_inductor_without_gradients_returns_the_forward_the_hot_path_takes_apart():
    """This torch's ``compile_fx`` (no gradients) returns AOTAutograd's unboxed forward,
    and the call fxflops makes in its place (``compiled_fn([*params, *args])``) returns what
    the forward returns. A release whose forward moved fails here, naming the seam
    (``aot_forward_parts``); fxflops itself then calls the forward as it is."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    x = torch.randn(4, 8)
    forward, args = _aot_forward_of_inductor(model, x)
    parts = torch_compat.aot_forward_parts(forward)
    assert parts is not None, (forward.__module__, forward.__qualname__,
                               forward.__code__.co_freevars, forward.__code__.co_names)
    compiled, params = parts
    with torch.no_grad():
        ours, theirs = compiled([*params, *args]), forward(*args)
        eager = model(x)
    assert len(ours) == len(theirs) == 1
    assert torch.equal(ours[0], theirs[0])
    assert torch.allclose(ours[0], eager, atol=1e-6)


_called: list[int] = []


def _forward_of(compiled_fn, params_buffers_flat, variant: str):
    """AOTAutograd's forward's shape (``variant="same"``), or one that does a little more:
    reads a global, keeps a local more, or closes over one more variable."""
    calls = []
    if variant == "same":
        def forward(*runtime_args):
            full_args = []
            full_args.extend(params_buffers_flat)
            full_args.extend(runtime_args)
            return compiled_fn(full_args)
    elif variant == "global":
        def forward(*runtime_args):
            full_args = []
            full_args.extend(params_buffers_flat)
            full_args.extend(runtime_args)
            _called.append(1)
            return compiled_fn(full_args)
    elif variant == "local":
        def forward(*runtime_args):
            full_args = []
            full_args.extend(params_buffers_flat)
            full_args.extend(runtime_args)
            n = len(full_args)
            return compiled_fn(full_args[:n])
    else:
        def forward(*runtime_args):
            full_args = []
            full_args.extend(params_buffers_flat)
            full_args.extend(runtime_args)
            calls.append(1)
            return compiled_fn(full_args)
    forward.__module__, forward.__qualname__ = torch_compat.AOT_FORWARD
    return forward


@pytest.mark.parametrize("variant", ["global", "local", "free"])
def test_a_forward_that_does_more_is_called_as_it_is(variant):
    """The shape is taken apart only as it is: a function of the same name whose code
    reads a global, keeps another local or closes over another variable is not (nor is
    any other callable), and is called as it is."""
    compiled_fn = lambda args: args  # noqa: E731
    same = torch_compat.aot_forward_parts(_forward_of(compiled_fn, [1], "same"))
    assert same is not None and same[0] is compiled_fn and same[1] == [1]
    forward = _forward_of(compiled_fn, [1], variant)
    assert torch_compat.aot_forward_parts(forward) is None
    assert forward(2) == [1, 2]
    for other in (len, lambda *a: a, torch.nn.Linear(2, 2)):
        assert torch_compat.aot_forward_parts(other) is None
