"""The package's shape: every import (those inside functions and ``TYPE_CHECKING`` blocks
included) points down the layer order of docs/architecture.md, and no two modules import
each other, directly or through others. Also the public surface: every documented public name imports, and
``import fxflops`` loads nothing but the package itself."""

from __future__ import annotations

import ast
import importlib
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path
from typing import Any

from tests import procs

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fxflops"

# bottom first: a module may import its own layer's modules and any layer below it
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("fxflops.util", "fxflops.config", "fxflops.patching", "fxflops.placement",
              "fxflops.torch_compat")),
    ("cost", ("fxflops.cost",)),
    ("recording", ("fxflops.recording",)),
    ("report", ("fxflops.report", "fxflops.peaks")),
    ("outputs", ("fxflops.outputs",)),
    ("instrument", ("fxflops.instrument",)),
    ("integrations", ("fxflops.integrations",)),
    ("cli", ("fxflops.cli",)),
    ("api", ("fxflops", "fxflops.__main__")),
)


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, package.parent): p for p in sorted(package.rglob("*.py"))}


def layer_of(module: str) -> int:
    best, found = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), i
    if found is None:
        raise AssertionError(f"{module} is in no layer of LAYERS (docs/architecture.md)")
    return found


def imports(path: Path, module: str, known: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every fxflops module ``path`` imports, anywhere in it: inside
    functions, and inside ``if TYPE_CHECKING:`` blocks too. A type-only import runs only
    under a type checker, but it is a dependency all the same: a reader of the annotation
    must read the module it names, and two modules that name each other's types cannot be
    understood one without the other (docs/architecture.md)."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "fxflops"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[: len(parent) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            if base.split(".")[0] != "fxflops":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((node.lineno, sub if sub in known else base))
    return found


def violations(package: Path = PACKAGE) -> list[str]:
    """Each import that points up the layer order, and each import cycle."""
    found = modules(package)
    known = set(found)
    graph: dict[str, set[str]] = {m: set() for m in found}
    problems = []
    for module, path in found.items():
        for line, target in imports(path, module, known):
            if target not in known:
                problems.append(f"{module}:{line} imports {target}, which does not exist")
                continue
            if target == module:
                continue
            graph[module].add(target)
            if layer_of(target) > layer_of(module):
                problems.append(f"{module}:{line} imports {target}: up from layer "
                                f"{LAYERS[layer_of(module)][0]} to {LAYERS[layer_of(target)][0]}")
    problems += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each
    as one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component) + [sorted(component)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_imports_point_down_the_layers_and_form_no_cycle():
    assert violations() == []


def test_the_recorder_is_recording_s_and_its_sinks_compose():
    """Compile-time code and integrations take the recorder from ``recording/`` (from
    ``outputs/`` only ``attach``, which subscribes the sinks), and nothing subclasses the
    recorder: outputs subscribe to it."""
    found = modules()
    for module, path in found.items():
        tree = ast.parse(path.read_text())
        if module.startswith(("fxflops.instrument", "fxflops.integrations")):
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == "fxflops.outputs.session":
                    names = {a.name for a in node.names}
                    assert names <= {"attach"}, f"{module}:{node.lineno} imports {names}"
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b).rpartition(".")[2] for b in node.bases}
                assert "Recorder" not in bases, f"{module}: {node.name} subclasses Recorder"


def test_a_reversed_import_is_caught(tmp_path):
    """The check can fail: a copy of the package with one import added that points up
    (the cost model importing the session's handle) is reported, as a layer violation and as
    the cycle it closes."""
    import shutil

    copy = tmp_path / "fxflops"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "cost" / "graph_cost.py"
    target.write_text(target.read_text() + "\n\ndef _late():\n"
                      "    from fxflops.outputs.session import session\n    return session\n")
    found = violations(copy)
    assert any("fxflops.cost.graph_cost" in p and "up from layer cost to outputs" in p
               for p in found), found
    assert any(p.startswith("import cycle:") and "fxflops.cost.graph_cost" in p
               for p in found), found


def _package(root: Path, files: dict[str, str]) -> Path:
    """A tiny package named ``fxflops`` under ``root`` (the checker reads only fxflops'
    imports): ``files`` maps paths under it to their source."""
    for name, text in {"__init__.py": '"""The package."""\n', **files}.items():
        path = root / "fxflops" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "fxflops"


def test_a_type_only_cycle_is_caught(tmp_path):
    """Two modules of a synthetic package that name each other, one of them only under
    ``TYPE_CHECKING`` (spelled either way), are a cycle; the same modules with the
    type-only import gone are not."""
    rows = ('"""Rows."""\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n'
            '    from fxflops.recording.recorder import Recorder\n')
    recorder = '"""Recorder."""\nfrom fxflops.recording.rows import Row\n'
    files = {"recording/__init__.py": '"""Recording."""\n', "recording/rows.py": rows,
             "recording/recorder.py": recorder}
    assert violations(_package(tmp_path / "a", files)) == [
        "import cycle: fxflops.recording.recorder -> fxflops.recording.rows -> "
        "fxflops.recording.recorder"]
    spelled = rows.replace("from typing import TYPE_CHECKING", "import typing").replace(
        "if TYPE_CHECKING:", "if typing.TYPE_CHECKING:")
    assert len(violations(_package(tmp_path / "b", {**files, "recording/rows.py": spelled}))) == 1
    acyclic = {**files, "recording/rows.py": '"""Rows."""\n'}
    assert violations(_package(tmp_path / "c", acyclic)) == []


def test_the_recorder_and_its_scopes_import_each_other_no_more(tmp_path):
    """The cycle this check once let pass (``scopes`` naming ``Recorder`` for a type) is
    caught where it is put back in a copy of the package: as a cycle, and only that."""
    import shutil

    copy = tmp_path / "fxflops"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "recording" / "scopes.py"
    target.write_text(target.read_text() + "\n\nif TYPE_CHECKING:\n"
                      "    from fxflops.recording.recorder import Recorder\n")
    found = violations(copy)
    assert found == ["import cycle: fxflops.recording.recorder -> fxflops.recording.scopes -> "
                     "fxflops.recording.recorder"], found


# the serving engines fxflops integrates with: only ``fxflops/integrations/`` may import them
ENGINES = ("vllm", "sglang")
INTEGRATIONS = "fxflops.integrations"


def _engine(name: object) -> str | None:
    """The engine a module name (or the literal start of one) is of, else None."""
    if not isinstance(name, str):
        return None
    top = name.split(".")[0]
    return top if top in ENGINES else None


def _literal_start(node: ast.expr) -> str | None:
    """The string an argument starts with: a literal, or an f-string's literal head."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        return _literal_start(node.values[0])
    return None


def engine_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of an engine's package in ``path``, anywhere in it
    (inside functions and ``TYPE_CHECKING`` blocks too): ``import vllm``,
    ``from vllm.config import ...``, and ``importlib.import_module("vllm...")`` or
    ``__import__("vllm...")`` with the name spelled out (a literal or an f-string's head)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if _engine(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if not node.level and _engine(node.module):
                found.append((node.lineno, str(node.module)))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name not in ("import_module", "__import__"):
                continue
            args = [*node.args[:1], *(k.value for k in node.keywords if k.arg == "name")]
            for arg in args:
                start = _literal_start(arg)
                if _engine(start):
                    found.append((node.lineno, str(start)))
    return found


def engine_import_violations(package: Path = PACKAGE) -> list[str]:
    """Each import of an engine's package outside ``fxflops/integrations/``: the engine's
    knowledge lives behind its integration, its op formulas included."""
    return [f"{module}:{line} imports {target} outside {INTEGRATIONS}"
            for module, path in modules(package).items()
            if not (module == INTEGRATIONS or module.startswith(INTEGRATIONS + "."))
            for line, target in engine_imports(path)]


def test_only_the_integrations_import_an_engine():
    assert engine_import_violations() == []
    # (the integration does import vLLM: the check looks where the imports are)
    assert any(engine_imports(path) for module, path in modules().items()
               if module.startswith(INTEGRATIONS + ".vllm"))


def test_an_engine_import_outside_the_integrations_is_caught(tmp_path):
    """The check can fail: a copy of the package with vLLM imported below the integrations,
    each way (at module level, inside a function, by ``importlib.import_module`` with the
    name spelled out, and an f-string's), is reported, each with its module and line; the
    same imports inside the integration are not."""
    import shutil

    copy = tmp_path / "fxflops"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    added = {
        ("cost", "graph_cost.py"): "\n\ndef _late():\n    from vllm.forward_context import "
                                   "get_forward_context\n    return get_forward_context\n",
        ("cost", "registry.py"): "\nimport vllm.config  # noqa\n",
        ("recording", "phases.py"): "\n\ndef _late():\n    import importlib\n\n    return "
                                    "importlib.import_module('vllm.config')\n",
        ("report", "engine.py"): "\n\ndef _late(name):\n    import importlib\n\n    return "
                                 "importlib.import_module(f'vllm.{name}')\n",
        ("integrations", "vllm", "models.py"): "\nimport vllm.config  # noqa\n",
    }
    for parts, code in added.items():
        target = copy.joinpath(*parts)
        target.write_text(target.read_text() + code)
    found = engine_import_violations(copy)
    for module, target in (("fxflops.cost.graph_cost", "vllm.forward_context"),
                           ("fxflops.cost.registry", "vllm.config"),
                           ("fxflops.recording.phases", "vllm.config"),
                           ("fxflops.report.engine", "vllm.")):
        assert any(p.startswith(f"{module}:") and f"imports {target} " in p for p in found), \
            (module, found)
    assert len(found) == 4, found  # the integration's own import is not one


def test_the_cost_model_knows_no_engine_and_an_integration_registers_its_formulas():
    """``fxflops.cost`` analyses with the engine-neutral formulas only: it loads neither vLLM
    nor the integrations. vLLM's formulas come with the integration's package (which
    imports no vLLM either), once however often it is imported, and with the public API."""
    code = (
        "import importlib, sys\n"
        "import fxflops.cost.analysis\n"
        "from fxflops.cost.registry import formula_for\n"
        "def loaded(): return sorted(m for m in sys.modules if m.split('.')[0] == 'vllm' or "
        "m.startswith('fxflops.integrations'))\n"
        "print(loaded(), formula_for('vllm::moe_forward') is None)\n"
        "import fxflops\n"
        "fxflops.analyze\n"
        "print(formula_for('vllm::moe_forward') is not None)\n"
        "importlib.import_module('fxflops.integrations.vllm.formulas.ops')\n"
        "from fxflops.integrations import load_formulas\n"
        "load_formulas()\n"
        "print([m for m in loaded() if not m.startswith('fxflops.')])\n")
    out = procs.run([sys.executable, "-c", code], timeout=300, cwd=ROOT,
                    capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["[] True", "True", "[]"], out


def test_every_module_is_in_a_layer_and_says_what_it_does():
    for module, path in modules().items():
        layer_of(module)
        tree = ast.parse(path.read_text())
        doc = ast.get_docstring(tree)
        if path.name == "__init__.py" and not tree.body:
            continue  # an empty namespace package file
        assert doc and "TODO" not in doc, f"{module} has no docstring saying its one job"


def test_architecture_doc_names_every_module():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for module, path in modules().items():
        if path.name == "__init__.py" and module != "fxflops":
            continue
        rel = str(path.relative_to(ROOT))
        assert rel in doc or f"`{module}`" in doc, f"docs/architecture.md does not name {rel}"
    for _, prefixes in LAYERS:
        for prefix in prefixes:
            if prefix in modules():
                assert prefix.replace(".", "/") in doc or f"`{prefix}`" in doc, prefix


# the public surface (docs/reference.md's Python API), importable by these names
PUBLIC = {
    "fxflops": ["backend", "recorder", "reset_recorder", "scope", "peak", "load_report",
                "analyze", "GraphCost", "NodeCost", "CostAt", "register_formula",
                "register_zero_flop", "register_bytes", "register_io_bytes", "__version__"],
}


def test_every_documented_public_name_imports():
    import importlib

    for module, names in PUBLIC.items():
        mod = importlib.import_module(module)
        for name in names:
            assert getattr(mod, name) is not None, f"{module}.{name}"
    # the entry points pyproject.toml declares resolve to what they name
    text = (ROOT / "pyproject.toml").read_text()
    for target in ("fxflops.instrument.entry_points:fxflops_backend",
                   "fxflops.integrations.vllm.plugin:register",
                   "fxflops.integrations.sglang.plugin:register", "fxflops.cli.main:main"):
        assert f'"{target}"' in text, target
        module, _, attr = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attr))


def test_backend_by_name_resolves_through_dynamo():
    import torch

    from fxflops.instrument.backend import fxflops_backend

    backend = torch._dynamo.lookup_backend("fxflops")
    assert getattr(backend, "__wrapped__", backend) is fxflops_backend or \
        backend is fxflops_backend


# a child's prelude: the exit and fork hooks fxflops' own code registers, counted
HOOKS_WATCHED = (
    "import atexit, os, sys\n"
    "real_exit, real_fork = atexit.register, os.register_at_fork\n"
    "def ours(f): return str(getattr(f, '__module__', '')).startswith('fxflops')\n"
    "registered, forks = [], []\n"
    "def on_exit(f, *a, **k):\n"
    "    registered.extend([f] if ours(f) else []); return real_exit(f, *a, **k)\n"
    "def on_fork(**k):\n"
    "    forks.extend(f for f in k.values() if ours(f)); return real_fork(**k)\n"
    "atexit.register, os.register_at_fork = on_exit, on_fork\n")


def test_import_fxflops_is_light_and_has_no_side_effects():
    """``import fxflops`` loads the package alone (no torch, no submodule), installs no
    exit or fork hook and patches nothing: those come at first use."""
    code = HOOKS_WATCHED + (
        "before = set(sys.modules)\n"
        "import fxflops\n"
        "new = set(sys.modules) - before\n"
        "print(sorted(m for m in new if m.split('.')[0] in ('fxflops', 'torch', 'vllm')))\n"
        "print(len(registered), len(forks))\n")
    out = procs.run([sys.executable, "-c", code], timeout=120, cwd=ROOT,
                    capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "['fxflops']", out[0]  # (the standard library's typing may come too)
    assert out[1] == "0 0"


def test_instrumenting_modules_install_nothing_at_import():
    """Importing the backend, the recorder, the session, its lifecycle and signals and the
    Prometheus module registers no exit or fork hook and patches no FSDP class (they are
    installed when fxflops is first used)."""
    code = HOOKS_WATCHED + (
        "import fxflops.instrument.backend, fxflops.outputs.session\n"
        "import fxflops.recording.recorder, fxflops.outputs.lifecycle\n"
        "import fxflops.outputs.signals, fxflops.report.scope\n"
        "import fxflops.outputs.prometheus, fxflops.instrument.distributed_hooks as d\n"
        "print(len(registered), len(forks), len(d.PATCHES))\n")
    out = procs.run([sys.executable, "-c", code], timeout=300, cwd=ROOT,
                    capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", "0", "0"], out


def test_the_cli_starts_without_torch_or_vllm():
    """``fxflops report/compare/tune`` read JSON: the CLI's entry imports neither torch nor
    vLLM (a command that only reads reports starts in a fraction of a second)."""
    code = "import sys, fxflops.cli.main; print(sorted({'torch', 'vllm'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=ROOT,
                         capture_output=True, text=True).stdout.strip()
    assert out == "[]", out


# a dotted ``fxflops.`` name as prose cites it (``fxflops.register_*``: a pattern, skipped)
CITED = re.compile(r"(?<![\w.])fxflops(?:\.[A-Za-z_]\w*)+(?![\w*])")


def resolves(dotted: str) -> bool:
    """``dotted`` names a module of fxflops, or an attribute of one (the longest module
    prefix imported, the rest looked up on it)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def cited_names(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every dotted ``fxflops.`` name in ``path``'s docstrings and
    comments (a Python file) or text (a Markdown page)."""
    text = path.read_text()
    if path.suffix == ".md":
        return [(i, m.group(0)) for i, line in enumerate(text.splitlines(), 1)
                for m in CITED.finditer(line)]
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False) or ""
            found += [(getattr(node, "lineno", 1), m.group(0)) for m in CITED.finditer(doc)]
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            found += [(token.start[0], m.group(0)) for m in CITED.finditer(token.string)]
    return found


def stale_citations(paths: list[Path]) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line} cites {name}, which does not exist"
            for path in paths for line, name in cited_names(path) if not resolves(name)]


def test_docstrings_comments_and_docs_cite_names_that_exist():
    """Every dotted ``fxflops.`` name a docstring, a comment or a docs page cites is a
    module or an attribute of one (a module that moved leaves none behind)."""
    paths = [*sorted(PACKAGE.rglob("*.py")), *sorted((ROOT / "docs").glob("*.md")),
             ROOT / "README.md"]
    assert stale_citations(paths) == []


def test_a_stale_citation_is_caught(tmp_path):
    """The check finds a moved module's old name in a docstring and in a comment, and
    lets a real one and a pattern pass."""
    module = tmp_path / "moved.py"
    module.write_text('"""Rows as ``fxflops.steps`` counts them (``fxflops.report.steps``)."""\n'
                      "# see fxflops.session.recorder and fxflops.register_*\n")
    page = tmp_path / "page.md"
    page.write_text("Use `fxflops.recorder()`, not `fxflops.kernels.KernelCost`.\n")
    assert [name for _, name in cited_names(module)] == [
        "fxflops.steps", "fxflops.report.steps", "fxflops.session.recorder"]
    stale = [(line, name) for line, name in cited_names(module) + cited_names(page)
             if not resolves(name)]
    assert stale == [(1, "fxflops.steps"), (2, "fxflops.session.recorder"),
                     (1, "fxflops.kernels.KernelCost")]
