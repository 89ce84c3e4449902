"""Every ```python block in the README and docs/ runs, as written."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [(path, i, code) for path in DOCS
          for i, code in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.S))]


@pytest.mark.parametrize("path,index,code", BLOCKS,
                         ids=[f"{p.name}#{i}" for p, i, _ in BLOCKS])
def test_doc_example_runs(path, index, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # run as a script's module is: one sys.modules holds (torch 2.11's Dynamo looks its
    # globals up there, by name: a name of its own per example)
    page = re.sub(r"\W", "_", path.stem)
    module = types.ModuleType(f"__doc_example_{page}_{index}__")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(code, f"{path.name}#{index}", "exec"), module.__dict__)


def test_readme_links_the_docs():
    readme = (ROOT / "README.md").read_text()
    for page in ("getting-started.md", "vllm.md", "serving.md", "training.md",
                 "conventions.md", "reference.md", "benchmarks.md", "many-devices.md",
                 "kernels.md", "sglang.md"):
        assert f"docs/{page}" in readme and (ROOT / "docs" / page).exists()
