"""One moved vLLM name switches off one feature, loudly (fxflops/integrations/vllm/features.py).

Each runner-level symbol of ``symbols.SYMBOLS`` is removed from the installed vLLM in turn
(the attribute deleted where it is defined; a whole module made unimportable; a parameter
renamed): fxflops still installs its compile backend and records the graphs vLLM's own
``CompilerManager`` compiles, and exactly the features that symbol serves are off, named
in the log and in the report with the vLLM version. Without the compilation interface,
fxflops says so as an error naming the version and what it looked for.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys

import pytest
import torch

import fxflops

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from fxflops.integrations.vllm import features, plugin  # noqa: E402
from fxflops.integrations.vllm.symbols import COMPILE, SYMBOLS, resolve  # noqa: E402

RUNNER_LEVEL = [s for s in SYMBOLS if s.feature != COMPILE]


def _silu_mm(x, w):
    return torch.nn.functional.silu(x @ w)


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """fxflops switched off in this process before and after: no hook, nothing noted."""
    monkeypatch.setenv("FXFLOPS", "1")
    monkeypatch.setenv("FXFLOPS_OUT", str(tmp_path / "out"))
    off_here()  # (read before any test removes anything)
    plugin.uninstall()
    fxflops.reset_recorder()
    yield
    plugin.uninstall()
    fxflops.reset_recorder()


@functools.lru_cache(maxsize=1)
def off_here() -> frozenset[str]:
    """The features off on this vLLM as it is (a release lacks some by design)."""
    from fxflops.integrations.vllm.symbols import FEATURES, missing

    return frozenset(f for f in FEATURES if missing(f))


def compile_and_run(tmp_path) -> list[dict]:
    """vLLM's own mode-3 compiler (its eager adaptor: fast) on a real Dynamo graph: the
    rows fxflops records for it."""
    from vllm.compilation.backends import CompilerManager
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
    from vllm.config.utils import Range

    from tests.helpers import compiler_manager_kwargs, dynamo_graph

    w = torch.randn(32, 64)
    x = torch.randn(8, 32)
    torch._dynamo.mark_dynamic(x, 0)
    captured = dynamo_graph(_silu_mm, x, w)
    cc = CompilationConfig(mode=3, backend="eager")
    with set_current_vllm_config(VllmConfig(compilation_config=cc)):
        manager = CompilerManager(cc, **compiler_manager_kwargs())
        manager.initialize_cache(str(tmp_path / "cache"), disable_cache=True, prefix="")
        fn = manager.compile(captured["gm"], captured["ex"], {}, cc, Range(start=1, end=16),
                             graph_index=0, num_graphs=1)
        xb = torch.randn(5, 32)
        args = [5 if isinstance(e, (int, torch.SymInt)) else (xb if e.shape[0] == 8 else w)
                for e in captured["ex"]]
        out = fn(*args)
    out = out[0] if isinstance(out, (tuple, list)) else out
    torch.testing.assert_close(out, _silu_mm(xb, w))
    return fxflops.recorder().stats()


def _owner(module: str, name: str):
    owner = importlib.import_module(module)
    for part in name.split(".")[:-1]:
        owner = getattr(owner, part)
    return owner


def _remove(symbol, monkeypatch) -> set[str]:
    """Remove what the symbol names: its last attribute, from every class of its owner's
    MRO that defines it (or from its module); where a base still gives one (``object``'s
    ``__init__``), the owner class itself, from its module (a class vLLM moved). Returns
    the features of every symbol that no longer resolves for it (a subclass's symbol
    whose method was its base's; every symbol of a removed class)."""
    path = symbol.name.split(".")
    owner = _owner(symbol.module, symbol.name)
    removed_from = [c for c in getattr(owner, "__mro__", (owner,))
                    if c is not object and path[-1] in vars(c)]
    for where in removed_from:
        monkeypatch.delattr(where, path[-1])
    if hasattr(owner, path[-1]):  # a base's still there: the class goes
        monkeypatch.delattr(importlib.import_module(symbol.module), path[0])
        return _served_by(symbol.module, path[0])
    affected = set()
    for s in SYMBOLS:
        if s.name.split(".")[-1] != path[-1]:
            continue
        try:
            other = _owner(s.module, s.name)
        except Exception:
            continue
        if not hasattr(other, path[-1]) and \
                any(c in getattr(other, "__mro__", (other,)) for c in removed_from):
            affected.add(s.feature)
    return affected


def _served_by(module: str, name: str) -> set[str]:
    """The features of every symbol that names ``module.name`` or an attribute below it."""
    return {s.feature for s in SYMBOLS if s.module == module and
            (s.name == name or s.name.startswith(name + "."))}


@pytest.mark.parametrize("symbol", RUNNER_LEVEL, ids=[f"{s.module}.{s.name}:{s.feature}"
                                                      for s in RUNNER_LEVEL])
def test_a_removed_runner_symbol_turns_off_its_feature_alone(symbol, fresh, monkeypatch,
                                                             tmp_path, caplog):
    try:
        resolve(symbol)
    except LookupError:
        assert symbol.feature in off_here()
        pytest.skip(f"absent from vLLM {vllm.__version__} already: {symbol.feature} is off")
    expected = _remove(symbol, monkeypatch)
    assert symbol.feature in expected
    with caplog.at_level(logging.INFO, logger="fxflops"):
        plugin.install()
    assert set(features.OFF) == set(off_here()) | expected, features.OFF
    assert COMPILE in features.INSTALLED
    # graphs are still recorded, through vLLM's own compiler
    rows = compile_and_run(tmp_path)
    assert [(r["graph"], r["size"], r["calls"]) for r in rows] == \
        [("piece0of1:range[1,16]", 5, 1)]
    assert rows[0]["matmul_flops"] == 2 * 5 * 32 * 64
    # named in the report, with the version, and once in the log
    off = fxflops.recorder().to_dict()["process"]["features_off"]
    for feature in expected:
        assert off[feature].startswith(f"vllm {vllm.__version__}: ")
        said = [r for r in caplog.records if f"fxflops: {feature} off" in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in caplog.records]


def test_a_removed_module_turns_off_what_it_serves(fresh, monkeypatch, tmp_path):
    """A runner module vLLM removes (0.34 removed ``vllm.v1.worker.gpu_model_runner``):
    importing it fails, and only the features that live in it are off."""
    module = "vllm.v1.worker.gpu.spec_decode.speculator"
    if module not in {s.module for s in SYMBOLS} or _absent(module):
        pytest.skip(f"{module} absent here")
    monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    plugin.install()
    expected = {s.feature for s in SYMBOLS if s.module == module}
    assert set(features.OFF) == set(off_here()) | expected
    assert all(f"no module {module}" in features.OFF[f] for f in expected)
    assert compile_and_run(tmp_path)[0]["calls"] == 1


def test_a_renamed_parameter_turns_off_its_feature(fresh, monkeypatch, tmp_path, capsys):
    """A parameter fxflops binds by name (the V2 step's batch), renamed in a later vLLM."""
    try:
        from vllm.v1.worker.gpu import async_utils
    except Exception:
        pytest.skip("no V2 runner here")

    def record_batch(self, batch, full_cudagraph=False):
        pass

    monkeypatch.setattr(async_utils.StepTimingCollector, "record_batch", record_batch)
    plugin.install()
    assert set(features.OFF) == set(off_here()) | {"whole forward (V2 runner)"}
    assert "has no parameter input_batch" in features.OFF["whole forward (V2 runner)"]
    assert compile_and_run(tmp_path)[0]["calls"] == 1
    # and `fxflops report` says it, with the version and why
    from fxflops.cli.main import main

    fxflops.recorder().save(str(tmp_path / "run.json"))
    monkeypatch.setenv("COLUMNS", "400")  # (one line, unwrapped)
    assert main(["report", str(tmp_path / "run.json")]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert ("features off: " in printed and "whole forward (V2 runner) (vllm "
            f"{vllm.__version__}: vllm.v1.worker.gpu.async_utils.StepTimingCollector."
            "record_batch has no parameter input_batch)") in printed, printed


def test_without_the_compilation_interface_fxflops_says_so_as_an_error(fresh, monkeypatch,
                                                                       caplog):
    from vllm.compilation import backends

    monkeypatch.delattr(backends.CompilerManager, "compile")
    with caplog.at_level(logging.ERROR, logger="fxflops"):
        plugin.install()
    assert COMPILE in features.OFF
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert f"vllm {vllm.__version__}" in errors[0]
    assert "vllm.compilation.backends.CompilerManager.compile" in errors[0]
    assert fxflops.recorder().to_dict()["process"]["features_off"][COMPILE]


def _absent(module: str) -> bool:
    try:
        importlib.import_module(module)
    except Exception:
        return True
    return False
