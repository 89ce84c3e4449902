"""Configuration: one typed module, read when used, the same table as docs/reference.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from fxflops import config

ROOT = Path(__file__).resolve().parents[1]


def test_docs_show_exactly_the_variables_the_code_reads():
    reference = (ROOT / "docs" / "reference.md").read_text()
    assert config.markdown_table() in reference
    # and nothing in the package reads an FXFLOPS_* variable around the config module
    import re

    names = {v.name for v in config.VARIABLES}
    for path in (ROOT / "fxflops").rglob("*.py"):
        if path.name == "config.py":
            continue
        for name in re.findall(r"os\.environ(?:\.get)?[\[(]\"(FXFLOPS\w*)\"", path.read_text()):
            pytest.fail(f"{path.name} reads {name} directly")
    assert len(names) == len(config.VARIABLES)


def test_read_when_used_not_at_import(monkeypatch):
    monkeypatch.setenv("FXFLOPS_WINDOW", "7")
    assert config.WINDOW.get() == 7
    monkeypatch.setenv("FXFLOPS_WINDOW", "9")
    assert config.WINDOW.get() == 9
    monkeypatch.delenv("FXFLOPS_WINDOW")
    assert config.WINDOW.get() == 512


@pytest.mark.parametrize("variable,raw,expected", [
    (config.WINDOW, "64", 64), (config.MAX_SIZES, " 10 ", 10), (config.FLUSH_S, "0.5", 0.5),
    (config.FLUSH_S, "0", 0.0), (config.PEAK_TFLOPS, "989.4", 989.4), (config.ENABLED, "1", True),
    (config.ENABLED, "off", False), (config.ENABLED, "", False), (config.OUT, "", None),
    (config.RANK, "3", 3)])
def test_good_values(monkeypatch, variable, raw, expected):
    monkeypatch.setenv(variable.name, raw)
    assert variable.get() == expected
