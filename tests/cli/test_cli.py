"""The command line on real reports: demo, report, compare, tune, plot; bad input -> exit 2."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import fxflops
from fxflops.cli.main import build_parser, main
from fxflops.outputs.dumps import annotate, readable_source
from fxflops.util import human
from tests import procs


def cli(*args: str) -> subprocess.CompletedProcess:
    return procs.run([sys.executable, "-m", "fxflops.cli.main", *args],
                     timeout=600)


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    # the folder from FXFLOPS_OUT, as every fxflops run takes it (no --out)
    proc = procs.run([sys.executable, "-m", "fxflops.cli.main", "demo", "--inner", "eager",
                      "--iters", "3"], timeout=600, cwd=tmp_path_factory.mktemp("cwd"),
                     env={**os.environ, "FXFLOPS_OUT": str(out)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(out.glob("fxflops-*.json")) and (out / "graphs").is_dir()
    # every (graph, size) row checked against FlopCounterMode: 4 decode and 4 prefill sizes
    assert "All match." in proc.stdout and proc.stdout.count("= exact") == 8
    return out


def test_demo_report_csv_json(demo_out, tmp_path):
    proc = cli("report", str(demo_out))
    assert proc.returncode == 0
    # a table row per (graph, size) the demo ran: decode batch 2..16, prefill 2 x 16..128
    for size in ("2", "16", "2x16", "2x128"):
        assert any(line.split("│")[2:3] and line.split("│")[2].strip() == size
                   for line in proc.stdout.splitlines()), size
    (report,) = demo_out.glob("fxflops-*.json")  # the demo writes one report per run
    proc = cli("report", str(report), "--json", "-")
    rows = json.loads(proc.stdout)
    assert rows and all(r["flops"] > 0 for r in rows)
    assert cli("report", str(demo_out), "--csv", str(tmp_path / "rows.csv")).returncode == 0
    assert (tmp_path / "rows.csv").read_text().startswith("rank,graph,size")


def test_compare_and_plot(demo_out, tmp_path):
    (report,) = demo_out.glob("fxflops-*.json")
    proc = cli("compare", str(report), str(report))
    assert proc.returncode == 0 and "1.00x" in proc.stdout
    png = tmp_path / "plot.png"
    proc = cli("plot", str(demo_out), "-o", str(png))
    assert proc.returncode == 0 and png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("content,message", [
    (None, "no such file"), ("", "empty file"), ('{"schema": "fxflops.report/1", "gra', "truncated"),
    ('{"hello": 1}', "not an fxflops report"), ("[1, 2]", "not an fxflops report")])
@pytest.mark.parametrize("command", ["report", "compare", "plot", "tune"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, content, message, command):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    args = {"report": [str(path)], "compare": [str(path), str(path)], "plot": [str(path)],
            "tune": [str(path)]}[command]
    proc = cli(command, *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr


def _report(path, rows_by_graph, forward=()):
    """A report as fxflops writes it (used for tune/compare cases with chosen medians)."""
    graphs = []
    for i, (name, symbols, rows, meta) in enumerate(rows_by_graph):
        graphs.append({"id": i, "name": name, "nodes": 1, "meta": meta, "symbols": symbols,
                       "flops": 1, "matmul_flops": 1, "bytes_io": 1, "bytes_nodes": 1,
                       "runtime_ops": [], "by_op": [], "by_module": [], "uncounted": {},
                       "dropped_sizes": 0, "rows": rows})
    data = {"schema": "fxflops.report/1", "process": {"pid": 1, "rank": None}, "peak": {},
            "graphs": graphs, "forward": list(forward)}
    path.write_text(json.dumps(data))
    return path


def _row(size, ms, calls=10):
    return {"size": size, "key": [size], "calls": calls, "total_ms": ms * calls,
            "median_ms": ms, "p10_ms": ms, "p90_ms": ms, "flops": 1000 * size,
            "matmul_flops": 1000 * size, "runtime_flops": 0, "bytes_io": 10, "bytes_nodes": 10,
            "gflops": size * 1e-6, "tflops": 1e-9, "gbps": 1.0, "mfu": None}


def test_tune_recommends_only_clearly_faster_sizes(tmp_path, capsys):
    general = _report(tmp_path / "general.json", [], forward=[_row(1, 10.0, 100), _row(8, 12.0, 50)])
    special = _report(tmp_path / "special.json",
                      [("piece0of1:size1", [], [_row(1, 5.0)], {"compile_size": 1}),
                       ("piece0of1:size8", [], [_row(8, 11.9)], {"compile_size": 8})],
                      forward=[_row(1, 6.0, 100), _row(8, 11.9, 50)])
    assert main(["tune", str(general), str(special)]) == 0
    out = capsys.readouterr().out
    assert '{"compile_sizes": [1]}' in out  # 1: 67% faster; 8: under 1%, not worth it
    slow = _report(tmp_path / "slow.json", [("piece0of1:size1", [], [_row(1, 10.0)],
                                             {"compile_size": 1})], forward=[_row(1, 10.1)])
    assert main(["tune", str(general), str(slow)]) == 0
    assert "no compile_sizes" in capsys.readouterr().out


def test_compare_shows_sizes_in_one_run_only(tmp_path, capsys):
    a = _report(tmp_path / "a.json", [], forward=[_row(1, 4.0), _row(2, 5.0)])
    b = _report(tmp_path / "b.json", [], forward=[_row(2, 2.5), _row(4, 6.0)])
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "2.00x" in out and "only in base" in out and "only in new" in out
    c = _report(tmp_path / "c.json", [], forward=[_row(16, 1.0)])
    assert main(["compare", str(a), str(c)]) == 2


def _shards(folder: Path, ms_by_rank: dict[int, float]) -> Path:
    """One run of two tensor-parallel shards (a graph each at sizes 2 and 4)."""
    folder.mkdir()
    for tp, ms in ms_by_rank.items():
        path = _report(folder / f"r{tp}.json",
                       [("graph0", ["s0"], [_row(2, ms), _row(4, 2 * ms)], {})])
        data = json.loads(path.read_text())
        data["run"] = {"id": folder.name}
        data["process"] = {"pid": 100 + tp, "rank": tp, "ranks": {"tp": tp, "tp_size": 2}}
        path.write_text(json.dumps(data))
    return folder


def test_compare_and_plot_say_what_they_merged(tmp_path, capsys):
    base = _shards(tmp_path / "base", {0: 4.0, 1: 5.0})
    new = _shards(tmp_path / "new", {0: 2.0, 1: 2.5})
    line = "merged (2 shard(s) x 1 stage(s) x 1 replica(s)): tensor-parallel shards"
    assert main(["compare", str(base), str(new)]) == 0
    out = capsys.readouterr().out
    assert f"base: {line}" in out and f"new: {line}" in out
    assert "2.00x" in out  # the slowest shard's 5.0 ms against 2.5 ms, by hand
    pytest.importorskip("matplotlib")
    assert main(["plot", str(base), "-o", str(tmp_path / "p.png")]) == 0
    assert line in capsys.readouterr().out


# --- outputs: through links, FIFOs and devices; atomic for files; the umask ------------


def _rows_report(tmp_path: Path) -> Path:
    return _report(tmp_path / "r.json", [("graph0", ["s0"], [_row(2, 1.0), _row(4, 2.0)], {})])


def _expected(report: Path, command: str, flag: str, capsys) -> bytes | None:
    """What the output file must hold: the text the same command prints for '-' (which
    adds a newline); for a plot, None (checked by its PNG signature)."""
    if command == "plot":
        return None
    assert main([command, str(report), flag, "-"]) == 0
    return capsys.readouterr().out[:-1].encode()


def _holds(data: bytes, expected: bytes | None) -> bool:
    return data.startswith(b"\x89PNG\r\n\x1a\n") if expected is None else data == expected


OUTPUTS = [("report", "--json"), ("report", "--csv"), ("plot", "-o")]


@pytest.mark.parametrize("command,flag", OUTPUTS)
def test_outputs_write_through_a_symlink(command, flag, tmp_path, capsys):
    report = _rows_report(tmp_path)
    expected = _expected(report, command, flag, capsys)
    target = tmp_path / "target.out"
    target.write_text("old")
    link = tmp_path / "link.out"
    link.symlink_to(target)
    assert main([command, str(report), flag, str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)  # still the link
    assert _holds(target.read_bytes(), expected)


@pytest.mark.parametrize("command,flag", OUTPUTS)
def test_outputs_write_through_a_fifo(command, flag, tmp_path, capsys):
    report = _rows_report(tmp_path)
    expected = _expected(report, command, flag, capsys)
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got: dict[str, bytes] = {}

    def read() -> None:
        with open(fifo, "rb") as f:  # waits for the writer
            got["data"] = f.read()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    proc = procs.run([sys.executable, "-m", "fxflops.cli.main", command, str(report),
                     flag, str(fifo)], timeout=120)
    reader.join(timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert not reader.is_alive(), "the FIFO was never opened for writing"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still the FIFO, not a file put there
    assert _holds(got["data"], expected)


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_new_files_honour_the_umask(umask, mode, tmp_path, capsys):
    from fxflops.util import atomic_text

    report = _rows_report(tmp_path)
    old = os.umask(umask)
    try:
        assert main(["report", str(report), "--json", str(tmp_path / "rows.json"),
                     "--csv", str(tmp_path / "rows.csv")]) == 0
        assert main(["plot", str(report), "-o", str(tmp_path / "p.png")]) == 0
        atomic_text("{}", tmp_path / "own" / "fxflops-h-1.json")  # fxflops' own reports
    finally:
        os.umask(old)
    for name in ("rows.json", "rows.csv", "p.png", "own/fxflops-h-1.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode, name


def test_an_existing_file_is_replaced_whole_and_keeps_its_mode(tmp_path, capsys):
    report = _rows_report(tmp_path)
    out = tmp_path / "rows.json"
    out.write_text("old")
    os.chmod(out, 0o640)
    twin = tmp_path / "twin.json"
    os.link(out, twin)  # a reader holding the old file
    assert main(["report", str(report), "--json", str(out)]) == 0
    assert [r["size"] for r in json.loads(out.read_text())] == [2, 4]
    assert twin.read_text() == "old"  # a new file renamed over the path: no half-written one
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "rows.json", "twin.json"]


@pytest.mark.parametrize("name,magic", [("plot", b"\x89PNG"), ("plot.png", b"\x89PNG"),
                                        ("plot.svg", b"<?xml")])
def test_plot_writes_the_path_it_names(name, magic, tmp_path, capsys):
    report = _rows_report(tmp_path)
    out = tmp_path / name
    assert main(["plot", str(report), "-o", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {out}"
    assert out.read_bytes().startswith(magic)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["r.json", name])


def test_demo_out_defaults_to_fxflops_out(monkeypatch, capsys):
    monkeypatch.setenv("FXFLOPS_OUT", "/some/where")
    assert build_parser().parse_args(["demo"]).out == "/some/where"
    assert build_parser().parse_args(["demo", "--out", "here"]).out == "here"
    monkeypatch.delenv("FXFLOPS_OUT")
    assert build_parser().parse_args(["demo"]).out == "fxflops-out"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--help"])
    assert "$FXFLOPS_OUT" in " ".join(capsys.readouterr().out.split())


def test_dump_comments_add_up_to_the_header_totals():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    seen = {}

    def be(gm, ex):
        seen["gm"], seen["cost"] = gm, fxflops.analyze(gm)
        return gm.forward

    torch.compile(model, backend=be)(torch.randn(3, 16))
    cost = seen["cost"]
    text = annotate(readable_source(seen["gm"]), cost, "g")

    shares = [float(m) for m in re.findall(r"# [^#]*?FLOP \((\d+\.\d)%\)", text)]
    assert abs(sum(shares) - 100.0) < 0.5
    costed = [n for n in cost.nodes if n.flops]
    assert len(shares) == len(costed)
    assert sum(n.flops for n in cost.nodes) == cost.flops
    assert f"# FLOPs:         {human(cost.flops, 'FLOP')}" in text


def test_dump_is_emitted_for_tlparse():
    """The annotated dump goes through torch._logging.trace_structured (what tlparse reads)."""
    import logging

    from torch._logging._internal import trace_log

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep(level=logging.DEBUG)
    old_level = trace_log.level
    trace_log.addHandler(handler)
    trace_log.setLevel(logging.DEBUG)
    try:
        torch.compile(torch.nn.Linear(4, 4), backend=fxflops.backend(inner="eager"))(
            torch.randn(2, 4))
    finally:
        trace_log.removeHandler(handler)
        trace_log.setLevel(old_level)
    ours = [r for r in records if "fxflops_graph0" in str(getattr(r, "metadata", r.msg))]
    assert ours, [str(r.msg)[:80] for r in records][:10]
    assert "# fxflops: graph graph0" in ours[0].payload


def test_tune_on_real_runs(tmp_path, capsys):
    """examples/tune_sizes.py: a general and a specialised run of the same model, then tune
    (eager inner here, so which sizes win is noise: the table and a verdict must come out)."""
    proc = procs.run([sys.executable, "examples/tune_sizes.py", str(tmp_path),
                     "--inner", "eager", "--sizes", "2", "4", "--iters", "5"],
                     timeout=600,
                     cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert main(["tune", str(tmp_path / "general"), str(tmp_path / "specialised")]) == 0
    out = capsys.readouterr().out
    # one table row per size run both ways, then one verdict naming only those sizes
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert sorted(line.split("│")[1].strip() for line in rows) == ["2", "4"]
    verdict = next(line for line in out.splitlines() if line.startswith("recommended:"))
    assert verdict.startswith("recommended: no compile_sizes") or re.fullmatch(
        r"recommended: -cc '\{\"compile_sizes\": \[(2|4|2, 4)\]\}'", verdict), verdict
