"""The fxflops backend on real torch.compile: identical outputs, rows per size, AOT, failures."""

from __future__ import annotations

import json
import os

import pytest
import torch

import fxflops
from fxflops.cli.demo_model import DemoConfig, DemoDecoder
from tests import procs

SMALL = DemoConfig(layers=1, vocab=64, hidden=64, heads=4, kv_heads=2, intermediate=96)


def test_registered_backend_name_and_identical_outputs_to_inductor():
    torch.manual_seed(0)
    model = DemoDecoder(SMALL).eval()
    ours = torch.compile(model, backend="fxflops", dynamic=True)
    ref = torch.compile(model, backend="inductor", dynamic=True)
    with torch.no_grad():
        for b, s in [(2, 8), (3, 5), (2, 8), (4, 16)]:
            x = torch.randint(0, 64, (b, s))
            assert torch.equal(ours(x), ref(x))  # bit for bit
    rows = fxflops.recorder().stats()
    by_size = {r["size"]: r for r in rows}
    assert set(by_size) == {"2x8", "3x5", "4x16"}
    assert by_size["2x8"]["calls"] == 2
    assert by_size["4x16"]["flops"] > by_size["2x8"]["flops"] > 0
    assert all(r["median_ms"] > 0 and r["tflops"] > 0 for r in rows)


@pytest.mark.parametrize("inner", ["eager", "aot_eager"])
def test_inner_backends_by_name(inner):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    compiled = torch.compile(model, backend=fxflops.backend(inner=inner, name="mlp{index}"))
    x = torch.randn(3, 8)
    assert torch.equal(compiled(x), model(x))
    (row,) = fxflops.recorder().stats()
    assert row["graph"] == "mlp0" and row["size"] == 3 and row["matmul_flops"] == 2 * 3 * 8 * 8


def test_inner_backend_callable_and_static_size_label():
    seen = []

    def inner(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    compiled = torch.compile(lambda x: x.sin() * 2, backend=fxflops.backend(inner=inner))
    compiled(torch.randn(6, 3))
    assert seen
    (row,) = fxflops.recorder().stats()
    assert row["size"] == 6 and row["flops"] == 2 * 18


def test_failure_inside_fxflops_is_logged_once_and_model_runs(fxflops_log):
    model = torch.nn.Linear(4, 4)
    wrappers = []
    fx = fxflops.backend(inner="eager")

    def capturing(gm, example_inputs):
        wrappers.append(fx(gm, example_inputs))
        return wrappers[-1]

    compiled = torch.compile(model, backend=capturing, dynamic=True)
    x = torch.randn(2, 4)
    with torch.no_grad():  # the Dynamo graph's own wrapper (tests/instrument/test_training.py: AOT's)
        compiled(x)
        graph = fxflops.recorder().graphs[0]

        def broken(args):
            raise RuntimeError("binder exploded")

        for wrapper in wrappers:
            wrapper._key = broken
        for b in (3, 5, 7):
            y = torch.randn(b, 4)
            assert torch.equal(compiled(y), model(y))
    messages = [r.getMessage() for r in fxflops_log.records if "binder exploded" in r.getMessage()]
    assert len(messages) == 1 and "runs uninstrumented" in messages[0]
    assert sum(r.count for r in graph.rows.values()) == 1


def test_analysis_failure_compiles_uninstrumented(monkeypatch, fxflops_log):
    import fxflops.instrument.plan

    def explode(*args, **kwargs):
        raise RuntimeError("analysis exploded")

    monkeypatch.setattr(fxflops.instrument.plan, "analyze", explode)
    compiled = torch.compile(lambda x: x * 3, backend="fxflops")
    x = torch.randn(4)
    assert torch.equal(compiled(x), x * 3)
    assert fxflops.recorder().graphs == []
    assert any("analysis exploded" in r.getMessage() for r in fxflops_log.records)


def test_exceptions_of_the_model_itself_propagate():
    def f(x):
        return torch.ops.aten.mm(x, x)

    compiled = torch.compile(f, backend=fxflops.backend(inner="eager"))
    compiled(torch.randn(3, 3))
    with pytest.raises(RuntimeError):
        compiled(torch.randn(3, 4))


def _f(x, w1, w2):
    return torch.relu(x @ w1) @ w2


def test_aot_compiled_artifact_keeps_reporting_after_save_and_load(tmp_path):
    w1, w2 = torch.randn(16, 32), torch.randn(32, 4)
    x = torch.randn(5, 16)
    torch._dynamo.mark_dynamic(x, 0)
    compiled = torch.compile(_f, backend="fxflops", fullgraph=True)
    if not hasattr(compiled, "aot_compile"):
        pytest.skip(f"torch {torch.__version__} has no torch.compile(...).aot_compile")
    aot = compiled.aot_compile(((x, w1, w2), {}))
    path = tmp_path / "artifact.bin"
    aot.save_compiled_function(str(path))
    # a fresh process: no graphs, an empty recorder
    fxflops.reset_recorder()
    torch._dynamo.reset()
    with open(path, "rb") as f:
        loaded = torch.compiler.load_compiled_function(f)
    for b in (7, 9, 7):
        xb = torch.randn(b, 16)
        assert torch.equal(loaded(xb, w1, w2), torch.compile(_f, backend="inductor")(xb, w1, w2))
    rows = {r["size"]: r for r in fxflops.recorder().stats()}
    assert set(rows) == {7, 9}
    assert rows[7]["calls"] == 2
    assert rows[9]["matmul_flops"] == 2 * 9 * 16 * 32 + 2 * 9 * 32 * 4
    assert fxflops.recorder().graphs[0].meta["loaded"] is True


def test_window_is_bounded_and_rows_are_per_size(monkeypatch):
    window = 16
    monkeypatch.setenv("FXFLOPS_WINDOW", str(window))  # read when a row is made
    compiled = torch.compile(lambda x: x + 1, backend=fxflops.backend(inner="eager"),
                             dynamic=True)
    xs = [torch.randn(n) for n in range(2, 12)]
    for _ in range(window + 10):
        for x in xs:
            compiled(x)
    graph = fxflops.recorder().graphs[0]
    assert len(graph.rows) == len(xs)
    for row in graph.rows.values():
        assert row.count == window + 10
        assert len(row.samples()) == window and len(row.window) == window
    # the median is the last ``window`` samples': older ones are overwritten, not kept
    row = next(iter(graph.rows.values()))
    for _ in range(3 * window):
        row.add(5000)
    for _ in range(window):
        row.add(1000)
    assert row.percentiles()["median_ms"] == 0.001
    assert row.total_ns >= 3 * window * 5000 + window * 1000


def test_report_file_is_written_at_flush_and_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("FXFLOPS_OUT", str(tmp_path))
    compiled = torch.compile(torch.nn.Linear(8, 2), backend=fxflops.backend(inner="eager"))
    compiled(torch.randn(4, 8))
    rec = fxflops.recorder()
    rec.flush()
    (path,) = tmp_path.glob("fxflops-*.json")
    report = fxflops.load_report(path)
    assert report["schema"] == "fxflops.report/1"
    assert report["process"]["pid"] == os.getpid()
    g = report["graphs"][0]
    assert g["flops"] == 2 * 4 * 8 * 2 and g["rows"][0]["calls"] == 1
    assert (tmp_path / "graphs" / f"{g['name']}.py").exists()
    assert not list(tmp_path.glob(".fxflops-*"))  # no temporary left behind
    json.loads(path.read_text())


def test_peak_env_gives_mfu(monkeypatch):
    monkeypatch.setenv("FXFLOPS_PEAK_TFLOPS", "1.5")
    monkeypatch.setenv("FXFLOPS_PEAK_GBPS", "100")
    compiled = torch.compile(torch.nn.Linear(64, 64), backend=fxflops.backend(inner="eager"))
    compiled(torch.randn(32, 64))
    (row,) = fxflops.recorder().stats()
    assert row["mfu"] == pytest.approx(row["matmul_flops"] / (row["median_ms"] / 1e3) / 1.5e12)
    assert row["bound"] in ("memory", "compute") and row["roofline_ms"] > 0


def test_import_is_light():
    import sys

    code = ("import sys, fxflops; fxflops.analyze; "
            "print(sorted(m for m in ('vllm', 'matplotlib', 'rich') if m in sys.modules))")
    out = procs.run([sys.executable, "-c", code], check=True)
    assert out.stdout.strip() == "[]"


def test_periodic_log_line_and_flush(tmp_path, monkeypatch, caplog):
    """FXFLOPS_LOG_INTERVAL: a log line like vLLM's batch-size one, FLOPs and rate added;
    FXFLOPS_FLUSH_S: the report is rewritten while the process runs."""
    import logging
    import time

    caplog.set_level(logging.INFO, logger="fxflops")
    monkeypatch.setenv("FXFLOPS_LOG_INTERVAL", "0.1")
    monkeypatch.setenv("FXFLOPS_FLUSH_S", "0.1")
    monkeypatch.setenv("FXFLOPS_OUT", str(tmp_path))
    compiled = torch.compile(torch.nn.Linear(8, 8), backend=fxflops.backend(inner="eager"),
                             dynamic=True)
    for b in (2, 3, 2):
        compiled(torch.randn(b, 8))
    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if "fxflops stats" in r.getMessage()]

    def rows_written() -> dict[int, int]:
        """The calls per size in the report file as the flush last wrote it."""
        paths = list(tmp_path.glob("fxflops-*.json"))
        if not paths:
            return {}
        graphs = fxflops.load_report(paths[0])["graphs"]
        return {r["size"]: r["calls"] for r in graphs[0]["rows"]} if graphs else {}

    # (a line or a file may come before the calls did: the report file is written when
    # the graph is registered, and a loaded machine runs the first call slowly)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (
            rows_written() == {2: 2, 3: 1} and
            any("(graph0, 2, 2, " in line and "(graph0, 3, 1, " in line for line in lines())):
        time.sleep(0.05)
    assert any("(graph0, 2, 2, " in line and "(graph0, 3, 1, " in line
               for line in lines()), lines()
    assert rows_written() == {2: 2, 3: 1}


def test_warmup_phases_are_recorded_apart_and_nest():
    """Calls inside ``recording.warmup`` go to that phase's rows (a graph compiled there
    too); the innermost phase counts; past the outermost, calls are traffic again."""
    from fxflops.recording.phases import SERVING, phase, warmup
    from fxflops.report.schema import validate

    compiled = torch.compile(lambda x: torch.relu(x @ x), backend=fxflops.backend(inner="eager"),
                             dynamic=True)
    with warmup("profile"):  # the first compile happens here
        compiled(torch.randn(8, 8))
        compiled(torch.randn(8, 8))
        assert phase() == "profile"
    compiled(torch.randn(4, 4))
    with warmup("capture"):
        with warmup("profile"):
            compiled(torch.randn(4, 4))
        compiled(torch.randn(4, 4))
    compiled(torch.randn(4, 4))
    assert phase() == SERVING
    report = fxflops.recorder().to_dict()
    validate(report, "report")
    (graph,) = report["graphs"]
    assert [(r["size"], r["calls"]) for r in graph["rows"]] == [(4, 2)]
    assert sorted((r["warmup"], r["size"], r["calls"]) for r in graph["warmup"]) == \
        [("capture", 4, 1), ("profile", 4, 1), ("profile", 8, 2)]
    # FLOPs of a warm-up row are the size's: 2 n^3 for the matmul, n^2 for the relu
    profile8 = next(r for r in graph["warmup"] if r["size"] == 8)
    assert profile8["flops"] == 2 * 8 ** 3 + 8 ** 2
