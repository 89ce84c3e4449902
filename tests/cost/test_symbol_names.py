"""Every size symbol of a formula says what it is (``s70 = input_ids.size(1)``): in the
graph's cost, its dumps, the JSON report, ``fxflops report`` and the demo; on a piece of a
graph vLLM split, too (the piece's own input named)."""

from __future__ import annotations

import copy
import inspect
import json
import pickle

import pytest
import torch

import fxflops
from fxflops.cli.demo_model import DemoConfig, DemoDecoder
from fxflops.cli.main import main
from fxflops.cost.binder import SymbolSource, user_name
from fxflops.report.files import load_report
from fxflops.report.schema import ReportError, validate

# the demo model's dimensions marked dynamic here: batch and sequence
DYNAMIC_DIMS = (0, 1)


def _input_name() -> str:
    """The demo model's one input, by its forward's signature (not by fxflops)."""
    params = [p for p in inspect.signature(DemoDecoder.forward).parameters if p != "self"]
    assert len(params) == 1, params
    return params[0]


@pytest.fixture
def demo_run(tmp_path, monkeypatch):
    """The demo model compiled with fxflops' backend (inner eager), batch and sequence
    dynamic, called at 3 x 20; flushed to ``tmp_path/out``."""
    out = tmp_path / "out"
    monkeypatch.setenv("FXFLOPS_OUT", str(out))
    torch.manual_seed(0)
    model = DemoDecoder(DemoConfig(layers=1)).eval()
    compiled = torch.compile(model, backend=fxflops.backend(inner="eager"))
    x = torch.randint(0, model.cfg.vocab, (3, 20))
    for dim in DYNAMIC_DIMS:
        torch._dynamo.mark_dynamic(x, dim)
    with torch.inference_mode():
        compiled(x)
    rec = fxflops.recorder()
    rec.flush()
    (graph,) = rec.graphs
    return graph, out, x


def _dim_of(graph, x: torch.Tensor) -> dict[str, int]:
    """Each symbol's dimension of ``x``, by the value the call was read at (3 x 20: each
    dimension's value its own)."""
    (row,) = graph.rows.values()
    assert len(set(x.shape)) == x.dim()
    return {str(s): list(x.shape).index(v) for s, v in zip(graph.cost.symbols, row.key)}


def test_each_symbol_is_named_by_the_input_and_dimension_it_came_from(demo_run):
    graph, _, x = demo_run
    cost = graph.cost
    assert len(cost.symbols) == len(DYNAMIC_DIMS)
    assert [s.symbol for s in cost.symbol_sources] == [str(s) for s in cost.symbols]
    dim_of = _dim_of(graph, x)
    assert sorted(dim_of.values()) == list(DYNAMIC_DIMS)
    name = _input_name()
    for named in cost.symbol_sources:
        dim = dim_of[named.symbol]
        assert named.where == f"{name}.size({dim})"
        assert str(named) == f"{named.symbol} = {name}.size({dim})"
        assert named.source == f"L['{name}'].size()[{dim}]"  # Dynamo's own, kept raw
    # plain data: it travels with a pickled plan, and a plan pickled before it loads
    assert pickle.loads(pickle.dumps(cost)).symbol_sources == cost.symbol_sources
    old = copy.copy(cost)
    del old.__dict__["symbol_sources"]
    assert pickle.loads(pickle.dumps(old)).symbol_sources == ()


def test_dumps_say_what_each_symbol_is(demo_run):
    graph, out, x = demo_run
    name = _input_name()
    symbolic = (out / "graphs" / f"{graph.name}.py").read_text()
    sized = (out / "graphs" / f"{graph.name}.size3x20.py").read_text()
    dim_of = _dim_of(graph, x)
    for named in graph.cost.symbol_sources:
        dim = dim_of[named.symbol]
        line = f"#   {named.symbol} = {name}.size({dim})"
        assert line in symbolic
        assert f"Dynamo: L['{name}'].size()[{dim}]" in symbolic
        # at a size, each symbol's value too
        assert f"{line} = {x.shape[dim]}" in sized
    # the formulas the header shows are of these symbols
    assert all(named.symbol in symbolic.split("# FLOPs:")[1].splitlines()[0]
               for named in graph.cost.symbol_sources)


def test_the_json_report_carries_them_and_old_reports_still_load(demo_run, tmp_path):
    graph, out, x = demo_run
    (path,) = out.glob("fxflops-*.json")
    report = load_report(path)  # validated
    (g,) = report["graphs"]
    name = _input_name()
    dim_of = _dim_of(graph, x)
    assert [s["symbol"] for s in g["symbol_sources"]] == g["symbols"]
    for s in g["symbol_sources"]:
        dim = dim_of[s["symbol"]]
        assert s["where"] == f"{name}.size({dim})"
        assert s["source"] == f"L['{name}'].size()[{dim}]"
    # a report written before symbols were named: loads, and `fxflops report` shows it
    old = json.loads(path.read_text())
    for g_old in old["graphs"]:
        del g_old["symbol_sources"]
    validate(old, "old")
    old_path = tmp_path / "old" / path.name
    old_path.parent.mkdir()
    old_path.write_text(json.dumps(old))
    assert main(["report", str(old_path)]) == 0
    # a damaged entry is refused, in one line
    bad = json.loads(path.read_text())
    bad["graphs"][0]["symbol_sources"][0]["where"] = 3
    with pytest.raises(ReportError, match=r"symbol_sources\[0\]: 'where' is int"):
        validate(bad, "bad")


def test_fxflops_report_prints_the_legend(demo_run, capsys):
    graph, out, _ = demo_run
    assert main(["report", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())  # (rich wraps long lines)
    legend = ", ".join(str(s) for s in graph.cost.symbol_sources)
    assert f"size symbols of {graph.name}: {legend}" in text
    name = _input_name()
    assert all(f"{name}.size({d})" in legend for d in DYNAMIC_DIMS)


def test_the_demo_names_the_symbols_under_its_module_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FXFLOPS_OUT", str(tmp_path / "demo"))  # (the demo sets it: undone)
    assert main(["demo", "--inner", "eager", "--iters", "1", "--layers", "1",
                 "--out", str(tmp_path / "demo")]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = next(i for i, line in enumerate(lines) if "top modules by FLOPs" in line)
    graph = lines[table].split("(")[1].split(",")[0]
    legend = next(line for line in lines[table:] if line.startswith("size symbols of"))
    assert legend.startswith(f"size symbols of {graph}: ")
    named = dict(part.split(" = ") for part in legend.split(": ", 1)[1].split(", "))
    name = _input_name()
    # prefill's graph: batch and sequence, each symbol one of the table's formulas uses
    assert sorted(named.values()) == [f"{name}.size({d})" for d in DYNAMIC_DIMS]
    formulas = "\n".join(lines[table:lines.index(legend)])
    assert all(symbol in formulas for symbol in named)


def test_without_dynamos_source_the_graphs_own_input_names_it():
    # (a piece analysed from vLLM's AOT artifact: a fresh shape environment, no sources)
    named = SymbolSource("s77", None, "getitem_3", 0)
    assert str(named) == "s77 = getitem_3.size(0)"
    assert str(SymbolSource("s77", None, "n_tokens", None)) == "s77 = n_tokens"
    # an int argument Dynamo named after the symbol says nothing: not "s77 = s77"
    assert str(SymbolSource("s77", None, "s77", None)) == "s77 = the int argument s77"
    assert SymbolSource("s77", "L['x'].size()[0]", "s77", None).read_from is None
    assert user_name("L['self']._modules['embed']._parameters['w'].size()[1]") == \
        "self.embed.w.size(1)"
    assert user_name("L['args'][0].stride()[2]") == "args[0].stride(2)"


# --- a piece of a graph vLLM split (mode 3's piecewise compile) ---------------------------------


def _mlp_with_a_split(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.nn.functional.silu(x @ w)
    z = torch.ops.aten.sin.default(y)  # the splitting op below
    return (z @ w.t()) * 2


SPLIT_AT = "aten::sin"


@pytest.mark.vllm
def test_a_vllm_piece_names_its_symbol(monkeypatch, tmp_path):
    """The last piece of a real Dynamo graph split by vLLM's ``split_graph``, compiled by
    vLLM's own ``CompilerManager``: its symbol named by the model's input (Dynamo's
    source) and by the piece's own input it is read from."""
    pytest.importorskip("vllm")
    monkeypatch.setenv("FXFLOPS", "1")
    monkeypatch.setenv("FXFLOPS_OUT", str(tmp_path / "out"))
    from vllm.compilation.backends import CompilerManager, split_graph
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
    from vllm.config.utils import Range

    from fxflops.integrations.vllm import plugin
    from fxflops.util import meta_value
    from tests.helpers import compiler_manager_kwargs, dynamo_graph

    plugin.install()
    w = torch.randn(32, 64)
    x = torch.randn(8, 32)
    torch._dynamo.mark_dynamic(x, 0)
    captured = dynamo_graph(_mlp_with_a_split, x, w)
    _, items = split_graph(captured["gm"], [SPLIT_AT])
    piece = items[-1]
    assert not piece.is_splitting_graph
    placeholders = [n for n in piece.graph.graph.nodes if n.op == "placeholder"]
    example_inputs = [meta_value(n) for n in placeholders]
    # the piece's tensor inputs of x's batch (its placeholders: the split graph's names)
    batch_inputs = {n.name for n, v in zip(placeholders, example_inputs)
                    if isinstance(v, torch.Tensor) and isinstance(v.shape[0], torch.SymInt)}
    assert batch_inputs and not batch_inputs & {"x", "l_x_"}

    cc = CompilationConfig(mode=3, backend="eager")
    with set_current_vllm_config(VllmConfig(compilation_config=cc)):
        manager = CompilerManager(cc, **compiler_manager_kwargs())
        manager.initialize_cache(str(tmp_path / "cache"), disable_cache=True, prefix="")
        fn = manager.compile(piece.graph, example_inputs, {}, cc, Range(start=1, end=16),
                             graph_index=len(items) - 1, num_graphs=len(items))
        b = 5
        # the piece's arguments at batch b: the size, the weight, b rows of activations
        real = [b if isinstance(v, torch.SymInt) else
                torch.randn(b, *v.shape[1:]) if isinstance(v.shape[0], torch.SymInt) else w
                for v in example_inputs]
        fn(*real)
    (graph,) = fxflops.recorder().graphs
    assert graph.meta.get("piece") == len(items) - 1
    (named,) = graph.cost.symbol_sources
    x_name = list(inspect.signature(_mlp_with_a_split).parameters)[0]
    assert str(named) == f"{named.symbol} = {x_name}.size(0)"
    assert named.read_from in {f"{n}.size(0)" for n in batch_inputs}
    (row,) = graph.rows.values()
    assert row.key == (b,)  # read from that input at run time
    dump = (tmp_path / "out" / "graphs").glob("piece*.py")
    text = "".join(p.read_text() for p in dump)
    assert f"this graph reads it from {named.read_from}" in text
    report = fxflops.recorder().to_dict()
    (g,) = report["graphs"]
    assert g["symbol_sources"][0]["where"] == f"{x_name}.size(0)"
    assert g["symbol_sources"][0]["input"] in batch_inputs
