"""Every vLLM symbol fxflops patches or reads exists in the installed vLLM, with the
parameters fxflops binds by name (fxflops/integrations/vllm/symbols.py)."""

from __future__ import annotations

import importlib
import inspect

import pytest

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from fxflops.integrations.vllm.symbols import SYMBOLS  # noqa: E402


@pytest.mark.parametrize("symbol", SYMBOLS, ids=[f"{s.module}.{s.name}" for s in SYMBOLS])
def test_symbol_exists_with_its_parameters(symbol):
    try:
        obj = importlib.import_module(symbol.module)
        for part in symbol.name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        if symbol.optional:
            pytest.skip(f"absent from this vLLM, which fxflops handles: {e}")
        raise AssertionError(f"{symbol.module}.{symbol.name} ({symbol.why}): {e}") from None
    if symbol.params:
        # a wrapped function (fxflops' own patch, if installed) shows the original's
        params = inspect.signature(inspect.unwrap(obj)).parameters
        missing = [p for p in symbol.params if p not in params]
        assert not missing, f"{symbol.name} ({symbol.why}) lost {missing}: {list(params)}"


def test_compiler_manager_is_built_as_each_release_builds_it():
    """vLLM 0.33 made ``use_aot_compile`` a required keyword; the tests build it either way."""
    from vllm.compilation.backends import CompilerManager
    from vllm.config import CompilationConfig

    manager = CompilerManager(CompilationConfig(mode=3), **compiler_manager_kwargs())
    assert hasattr(manager, "compile")


def compiler_manager_kwargs() -> dict:
    from vllm.compilation.backends import CompilerManager

    params = inspect.signature(CompilerManager.__init__).parameters
    return {"use_aot_compile": True} if "use_aot_compile" in params else {}


def test_every_warmup_method_is_in_the_table():
    """Each method hooks.WARMUP_METHODS patches by name is checked above, somewhere."""
    from fxflops.integrations.vllm.hooks import WARMUP_METHODS

    checked = {s.name.rsplit(".", 1)[-1] for s in SYMBOLS}
    assert set(WARMUP_METHODS) <= checked, set(WARMUP_METHODS) - checked
