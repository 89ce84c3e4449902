"""Faults and bad input: nothing a user types, sends or kills breaks the host or loses the
report. Each case asserts the exact promised behaviour:

- environment faults: the host's outputs are bit-identical, nothing raises, one warning
  names the variable, the value and the default used;
- CLI faults: one line on stderr, exit 2, no traceback;
- a folder with good and bad reports: the good ones shown, the bad ones named, exit 3;
- runs never mixed; calls past the size cap visible; SIGTERM leaves a valid report.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import fxflops
from fxflops.cli.main import main
from tests import procs

ROOT = Path(__file__).resolve().parents[2]


def _model_run(dynamic: bool = True) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(fxflops outputs, the same inner backend's outputs) of a small model at 3 sizes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    ours = torch.compile(model, backend=fxflops.backend(inner="eager"), dynamic=dynamic)
    ref = torch.compile(model, backend="eager", dynamic=dynamic)
    xs = [torch.randn(b, 8) for b in (2, 3, 5, 3)]
    with torch.no_grad():
        return [ours(x) for x in xs], [ref(x) for x in xs]


def _run_then_flush_twice() -> Any:
    """The model run (outputs bit for bit the inner backend's), then two flushes (a fault
    in the report's way is said once, not at every flush)."""
    ours, ref = _model_run()
    assert all(torch.equal(a, b) for a, b in zip(ours, ref))
    rec = fxflops.recorder()
    rec.flush()
    rec.flush()
    return rec


# --- environment faults ----------------------------------------------------------------

ENV_FAULTS = [
    ("FXFLOPS_WINDOW", "0"), ("FXFLOPS_WINDOW", "abc"), ("FXFLOPS_WINDOW", "-1"),
    ("FXFLOPS_WINDOW", ""), ("FXFLOPS_WINDOW", "1.5"), ("FXFLOPS_MAX_SIZES", "abc"),
    ("FXFLOPS_MAX_SIZES", "0"), ("FXFLOPS_PEAK_TFLOPS", "abc"), ("FXFLOPS_PEAK_TFLOPS", "-3"),
    ("FXFLOPS_PEAK_TFLOPS", "nan"), ("FXFLOPS_PEAK_GBPS", "inf"), ("FXFLOPS_FLUSH_S", "abc"),
    ("FXFLOPS_FLUSH_S", "-1"), ("FXFLOPS_LOG_INTERVAL", "soon"), ("FXFLOPS_RANK", "first"),
    ("FXFLOPS_RANK", "-2"), ("FXFLOPS", "maybe"), ("FXFLOPS_SAMPLE_EVERY", "-16"),
    ("FXFLOPS_SAMPLE_EVERY", "0"),
]


@pytest.mark.parametrize("name,value", ENV_FAULTS, ids=[f"{n}={v!r}" for n, v in ENV_FAULTS])
def test_bad_environment_value_warns_once_and_the_host_runs_on(name, value, monkeypatch,
                                                               tmp_path, fxflops_log):
    from fxflops import config

    monkeypatch.setenv("FXFLOPS_OUT", str(tmp_path))
    monkeypatch.setenv(name, value)
    ours, ref = _model_run()
    assert all(torch.equal(a, b) for a, b in zip(ours, ref))  # bit for bit
    rec = fxflops.recorder()
    rows = rec.stats()  # reading never raises either
    assert {r["size"] for r in rows} == {2, 3, 5} and sum(r["calls"] for r in rows) == 4
    rec.flush()
    (path,) = tmp_path.glob("fxflops-*.json")
    fxflops.load_report(path)
    variable = next(v for v in config.VARIABLES if v.name == name)
    warnings = [r.getMessage() for r in fxflops_log.records if name in r.getMessage()]
    if name == "FXFLOPS":  # read by the vLLM plugin only: read it as the plugin does
        assert variable.get() is False
        warnings = [r.getMessage() for r in fxflops_log.records if name in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"{name}={value!r}" in warnings[0] and f"default {variable.default!r}" in warnings[0]


def test_report_folder_that_is_a_file_warns_once_and_loses_nothing(tmp_path, monkeypatch,
                                                                   fxflops_log):
    blocker = tmp_path / "out"
    blocker.write_text("a file where the report folder should be")
    monkeypatch.setenv("FXFLOPS_OUT", str(blocker))
    rec = _run_then_flush_twice()
    messages = [r.getMessage() for r in fxflops_log.records if "could not write" in r.getMessage()]
    assert len(messages) == 1
    # the rows are still there: a later flush to a good folder writes them all
    monkeypatch.setenv("FXFLOPS_OUT", str(tmp_path / "good"))
    rec.flush()
    (path,) = (tmp_path / "good").glob("fxflops-*.json")
    assert sum(r["calls"] for r in fxflops.load_report(path)["graphs"][0]["rows"]) == 4


def test_a_graphs_folder_that_is_a_file_stops_only_the_dumps(tmp_path, monkeypatch,
                                                              fxflops_log):
    """OUT/graphs a file: the annotated dumps cannot be written (said once); the report
    still is, with every call."""
    (tmp_path / "graphs").write_text("a file where the dumps' folder should be")
    monkeypatch.setenv("FXFLOPS_OUT", str(tmp_path))
    _run_then_flush_twice()
    (path,) = tmp_path.glob("fxflops-*.json")
    assert sum(r["calls"] for r in fxflops.load_report(path)["graphs"][0]["rows"]) == 4
    said = [r.getMessage() for r in fxflops_log.records if "graphs" in r.getMessage()
            and r.levelname == "WARNING"]
    assert len(said) == 1, said
    assert (tmp_path / "graphs").read_text().startswith("a file")  # left as it was


# --- CLI faults ------------------------------------------------------------------------


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """The CLI in this process: (exit code, stdout, stderr)."""
    try:
        code = main(list(args))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 2
    out, err = capsys.readouterr()
    return code, out, err


def _good_report() -> dict:
    row = {"size": 4, "key": [4], "calls": 3, "total_ms": 3.0, "median_ms": 1.0, "p10_ms": 1.0,
           "p90_ms": 1.0, "flops": 1000, "matmul_flops": 800, "runtime_flops": 0,
           "bytes_io": 64, "bytes_nodes": 128, "gflops": 1e-6, "tflops": 1e-9, "gbps": 0.1,
           "mfu": None}
    return {"schema": "fxflops.report/1", "run": {"id": "run-a", "started": 1.0},
            "process": {"pid": 1, "rank": None, "host": "h"}, "peak": {},
            "graphs": [{"id": 0, "name": "graph0", "fingerprint": "abc", "meta": {},
                        "symbols": ["s0"], "uncounted": {}, "dropped_sizes": 0,
                        "rows": [row]}],
            "forward": []}


def _malformed(edit) -> dict:
    data = _good_report()
    edit(data)
    return data


MALFORMED = {
    "graphs not a list": (lambda d: d.update(graphs={"a": 1}), "'graphs' is dict"),
    "row without median_ms": (lambda d: d["graphs"][0]["rows"][0].pop("median_ms"),
                              "rows[0]: no 'median_ms'"),
    "calls is a string": (lambda d: d["graphs"][0]["rows"][0].update(calls="3"),
                          "'calls' is str"),
    "calls is a bool": (lambda d: d["graphs"][0]["rows"][0].update(calls=True),
                        "'calls' is bool"),
    "row is a number": (lambda d: d["graphs"][0]["rows"].append(7), "rows[1]: not an object"),
    "graph without a name": (lambda d: d["graphs"][0].pop("name"), "graphs[0]: no 'name'"),
    "forward not a list": (lambda d: d.update(forward=None), "'forward' is NoneType"),
    "no process": (lambda d: d.pop("process"), "no 'process'"),
    "another schema version": (lambda d: d.update(schema="fxflops.report/9"),
                               "fxflops.report/9 is not"),
    "flops is a string": (lambda d: d["graphs"][0]["rows"][0].update(flops="1e9"),
                          "'flops' is str"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
@pytest.mark.parametrize("command", ["report", "compare", "plot"])
def test_malformed_report_is_one_line_and_exit_2(case, command, tmp_path, capsys):
    edit, message = MALFORMED[case]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_malformed(edit)))
    args = {"report": [str(path)], "compare": [str(path), str(path)],
            "plot": [str(path), "-o", str(tmp_path / "p.png")]}[command]
    code, out, err = cli(capsys, command, *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert "Traceback" not in err + out


@pytest.mark.parametrize("args,message", [
    (["peak", "--dtype", "fp64"], "invalid choice: 'fp64'"),
    (["peak", "--n", "-5"], "-5 is not at least 1"),
    (["peak", "--n", "abc"], "'abc' is not a whole number"),
    (["demo", "--inner", "nonexistent"], "unknown backend 'nonexistent'"),
    (["demo", "--iters", "0"], "0 is not at least 1"),
    (["demo", "--layers", "-1"], "-1 is not at least 1"),
    (["compare", "only-one.json"], "the following arguments are required: new"),
    (["tune"], "the following arguments are required: runs"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["report", "/dev/zero"], "/dev/zero: not a regular file"),
    (["report", "/nonexistent/report.json"], "no such file"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_arguments_are_one_line_and_exit_2(args, message, capsys):
    code, out, err = cli(capsys, *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert "Traceback" not in err + out


def test_binary_garbage_and_deep_json_are_one_line(tmp_path, capsys):
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(bytes(range(256)) * 8)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for path, message in ((garbage, "not valid JSON"), (deep, "not valid JSON")):
        code, out, err = cli(capsys, "report", str(path))
        assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err


def test_report_write_into_a_folder_path_is_one_line(tmp_path, capsys):
    good = tmp_path / "r.json"
    good.write_text(json.dumps(_good_report()))
    code, out, err = cli(capsys, "report", str(good), "--json", str(tmp_path))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err


# --- numbers: finite, never negative, in range; checked at load ------------------------


def _two_sizes() -> dict:
    """A good report every command accepts: one graph at two sizes (tune needs two)."""
    data = _good_report()
    row = data["graphs"][0]["rows"][0]
    data["graphs"][0]["rows"].append({**row, "size": 8, "key": [8], "median_ms": 2.0})
    return data


def _row0(data: dict) -> dict:
    return data["graphs"][0]["rows"][0]


BAD_VALUES = {
    "NaN median": (lambda d: _row0(d).update(median_ms=float("nan")),
                   "rows[0]: 'median_ms' is nan: not a finite number"),
    "Infinity FLOPs": (lambda d: _row0(d).update(flops=float("inf")),
                       "rows[0]: 'flops' is inf: not a finite number"),
    "-Infinity time": (lambda d: _row0(d).update(total_ms=float("-inf")),
                       "rows[0]: 'total_ms' is -inf: not a finite number"),
    "400-digit FLOPs": (lambda d: _row0(d).update(flops=10**400),
                        "rows[0]: 'flops' is a 401-digit number: more than 1e30"),
    "huge float bytes": (lambda d: _row0(d).update(bytes_io=1e300),
                         "rows[0]: 'bytes_io' is 1e+300: more than 1e30"),
    "negative calls": (lambda d: _row0(d).update(calls=-3), "rows[0]: 'calls' is -3: negative"),
    "negative p90": (lambda d: _row0(d).update(p90_ms=-0.5), "'p90_ms' is -0.5: negative"),
    "peak.tflops a string": (lambda d: d.update(peak={"tflops": "989.4", "gbps": 4800.0}),
                             "peak: 'tflops' is str"),
    "peak.gbps negative": (lambda d: d.update(peak={"tflops": 1.0, "gbps": -1.0}),
                           "peak: 'gbps' is -1.0: negative"),
    "pid a list": (lambda d: d["process"].update(pid=[1, 2]), "process: 'pid' is list"),
    "rank a dict": (lambda d: d["process"].update(rank={"r": 0}), "process: 'rank' is dict"),
    "run.started a string": (lambda d: d["run"].update(started="today"),
                             "run: 'started' is str"),
    "meta.frame a list": (lambda d: d["graphs"][0]["meta"].update(frame=[1]),
                          "graphs[0].meta: 'frame' is list"),
    "size of non-ASCII digits": (lambda d: _row0(d).update(size="\u00b2x4"),
                                 "rows[0]: 'size' is '\u00b2x4': not a size"),
    "size past int64": (lambda d: _row0(d).update(size=2**63),
                        "'size' is 9223372036854775808: more than 2**63-1"),
    "scheduled 0 forwards": (lambda d: _row0(d).update(scheduled={"4": 0}),
                             "'scheduled' holds '4': 0: expected token counts"),
    "uncounted negative": (lambda d: d["graphs"][0].update(uncounted={"aten.foo": -1}),
                           "'uncounted' holds 'aten.foo': -1"),
    "row's graph a number": (lambda d: _row0(d).update(graph=5), "'graph' is int"),
}
BAD_THRESHOLDS = {"nan": "nan is not a finite number from 0",
                  "inf": "inf is not a finite number from 0",
                  "-0.1": "-0.1 is not a finite number from 0",
                  "abc": "'abc' is not a number"}
COMMANDS = ["report", "compare", "plot", "tune"]


def _command_args(command: str, path: Path, tmp_path: Path) -> list[str]:
    return {"report": [str(path)], "compare": [str(path), str(path)],
            "plot": [str(path), "-o", str(tmp_path / "p.png")], "tune": [str(path)]}[command]


@pytest.mark.parametrize("command", COMMANDS)
def test_the_good_report_passes_every_command(command, tmp_path, capsys):
    """The control for the bad values below: unedited, every command succeeds."""
    path = tmp_path / "good.json"
    path.write_text(json.dumps(_two_sizes()))
    code, out, err = cli(capsys, command, *_command_args(command, path, tmp_path))
    assert code == 0 and err == "", err


@pytest.mark.parametrize("case,command", [
    *((case, command) for case in BAD_VALUES for command in COMMANDS),
    *((f"--threshold {t}", "tune") for t in BAD_THRESHOLDS)],
    ids=lambda v: v.replace(" ", "_"))
def test_bad_values_are_one_line_and_exit_2(case, command, tmp_path, capsys):
    path = tmp_path / "bad.json"
    if case.startswith("--threshold"):
        threshold = case.split()[1]
        path.write_text(json.dumps(_two_sizes()))
        args = [str(path), str(path), "--threshold", threshold]
        message = BAD_THRESHOLDS[threshold]
    else:
        edit, message = BAD_VALUES[case]
        data = _two_sizes()
        edit(data)
        path.write_text(json.dumps(data))  # NaN and Infinity as Python writes them
        args = _command_args(command, path, tmp_path)
    code, out, err = cli(capsys, command, *args)
    assert code == 2, (code, err)
    (line,) = err.strip().splitlines()
    assert message in line and "Traceback" not in err + out, line


def _without_symbols(data: dict) -> dict:
    for g in data["graphs"]:
        g.pop("symbols", None)
        g.pop("meta", None)
    return data


@pytest.mark.parametrize("command", COMMANDS)
def test_a_report_without_symbols_or_meta_runs(command, tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_without_symbols(_two_sizes())))
    code, out, err = cli(capsys, command, *_command_args(command, path, tmp_path))
    assert code == 0 and err == "", err
    assert "graph0" in out or command in ("tune", "plot")


def test_tune_of_two_runs_reads_graphs_without_symbols(tmp_path, capsys):
    """The several-runs path: a graph without 'symbols' is a static (specialised) one."""
    general = _two_sizes()
    general["graphs"] = []
    general["forward"] = [{**_row0(_two_sizes()), "size": 4, "key": [4], "median_ms": 2.0}]
    sized = _without_symbols(_two_sizes())
    sized["forward"] = [{**_row0(_two_sizes()), "size": 4, "key": [4], "median_ms": 1.0}]
    (tmp_path / "general.json").write_text(json.dumps(general))
    (tmp_path / "sized.json").write_text(json.dumps(sized))
    code, out, err = cli(capsys, "tune", str(tmp_path / "general.json"),
                         str(tmp_path / "sized.json"))
    assert code == 0 and err == "", err
    assert '{"compile_sizes": [4]}' in out  # 2.0 ms general, 1.0 ms specialised: +100%


def test_size_cap_is_checked_before_reading(tmp_path, capsys):
    import tracemalloc

    from fxflops.report.files import MAX_REPORT_BYTES

    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(600 * 1000 * 1000)  # sparse: 600 MB on paper, nothing on disk
    assert big.stat().st_size > MAX_REPORT_BYTES
    tracemalloc.start()
    start = time.perf_counter()
    try:
        code, out, err = cli(capsys, "report", str(big))
        took = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 2 and err.strip() == f"fxflops report: error: {big}: larger than 512 MiB: not a report"
    # refused from its size alone: reading it would have taken 512 MiB and longer
    assert peak < 64 << 20 and took < 1.0, (peak, took)


# --- one bad file does not hide the good ones --------------------------------------------


def test_folder_shows_good_reports_and_names_bad_ones(tmp_path, capsys):
    (tmp_path / "good.json").write_text(json.dumps(_good_report()))
    (tmp_path / "truncated.json").write_text(json.dumps(_good_report())[:100])
    code, out, err = cli(capsys, "report", str(tmp_path))
    assert code == 3  # shown, but something was skipped
    assert "graph0" in out and "1 file(s) skipped" in out
    (line,) = err.strip().splitlines()
    assert "truncated.json" in line and "not valid JSON" in line


def test_exports_beside_reports_are_not_taken_for_reports(tmp_path, capsys):
    (tmp_path / "good.json").write_text(json.dumps(_good_report()))
    code, _, _ = cli(capsys, "report", str(tmp_path), "--json", str(tmp_path / "rows.json"))
    assert code == 0 and json.loads((tmp_path / "rows.json").read_text())
    code, out, err = cli(capsys, "report", str(tmp_path))
    assert code == 0 and err == "" and "graph0" in out


# --- runs know who they are --------------------------------------------------------------


def test_two_runs_in_one_folder_are_never_added(tmp_path, capsys):
    a = _good_report()
    b = _good_report()
    b["run"] = {"id": "run-b", "started": 2.0}
    b["process"] = {"pid": 2, "rank": None, "host": "h"}
    b["graphs"][0]["rows"][0]["flops"] = 5000
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    code, out, err = cli(capsys, "report", str(tmp_path), "--json", "-")
    rows = json.loads(out)
    assert code == 0 and sorted((r["run"], r["flops"]) for r in rows) == [
        ("run-a", 1000), ("run-b", 5000)]  # two rows, no sum of the two
    code, out, err = cli(capsys, "report", str(tmp_path))
    assert code == 0 and "2 runs" in out and "run run-a" in out and "run run-b" in out


def test_compare_refuses_rows_whose_flops_differ_unless_forced(tmp_path, capsys):
    a, b = _good_report(), _good_report()
    b["graphs"][0]["rows"][0]["flops"] = 2000
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    code, out, err = cli(capsys, "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert code == 2 and "FLOPs differ (1,000 vs 2,000)" in err and len(err.splitlines()) == 1
    code, out, err = cli(capsys, "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                         "--force")
    assert code == 0 and "1.00x" in out


def test_compare_keeps_graphs_that_share_a_name_apart(tmp_path, capsys):
    a = _good_report()
    twin = json.loads(json.dumps(a["graphs"][0]))
    twin.pop("fingerprint")
    a["graphs"][0].pop("fingerprint")
    twin["rows"][0]["median_ms"] = 4.0
    a["graphs"].append(twin)
    (tmp_path / "a.json").write_text(json.dumps(a))
    code, out, err = cli(capsys, "compare", str(tmp_path / "a.json"), str(tmp_path / "a.json"))
    assert code == 0
    assert "graph0#2" in out and out.count("1.00x") == 2


def test_demo_writes_one_report_per_run_and_says_where(tmp_path):
    proc = procs.run([sys.executable, "-m", "fxflops.cli.main", "demo", "--inner", "eager",
                     "--iters", "1", "--layers", "1", "--out", str(tmp_path)], timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (report,) = tmp_path.glob("*.json")
    assert f"report: {report}" in proc.stdout.replace("\n", "")


# --- nothing lost silently ---------------------------------------------------------------


def test_calls_past_the_size_cap_go_to_an_overflow_row(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("FXFLOPS_MAX_SIZES", "2")
    monkeypatch.setenv("FXFLOPS_OUT", str(tmp_path))
    compiled = torch.compile(lambda x: x * 2, backend=fxflops.backend(inner="eager"),
                             dynamic=True)
    for n in (2, 3, 4, 5, 6, 4, 4):
        compiled(torch.randn(n))
    graph = fxflops.recorder().graphs[0]
    assert len(graph.rows) == 2 and graph.dropped_sizes == 3  # sizes, not calls
    rows = {r["size"]: r for r in fxflops.recorder().stats()}
    assert rows["overflow"]["calls"] == 5 and rows[2]["calls"] == 1
    fxflops.recorder().flush()
    code, out, err = cli(capsys, "report", str(tmp_path))
    assert code == 0 and "overflow" in out and "3 sizes past FXFLOPS_MAX_SIZES" in out


_HOST = textwrap.dedent("""
    import os, signal, sys, time, torch, fxflops
    mode = sys.argv[1]
    if mode == "handler":
        def host_handler(sig, frame):
            print("host handler ran", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, host_handler)
    f = torch.compile(lambda x: x + 1, backend=fxflops.backend(inner="eager"), dynamic=True)
    for n in (2, 3, 2):
        f(torch.randn(n))
    try:  # (entered first: the signal may come as soon as "ready" is out)
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
    except KeyboardInterrupt:
        print("host saw KeyboardInterrupt", flush=True)
""")


@pytest.mark.parametrize("mode,sig", [("default", signal.SIGTERM), ("handler", signal.SIGTERM),
                                      ("default", signal.SIGINT)])
def test_signal_writes_the_report_and_keeps_the_hosts_behaviour(mode, sig, tmp_path):
    script = tmp_path / "host.py"
    script.write_text(_HOST)
    out = tmp_path / "out"
    env = {**os.environ, "FXFLOPS_OUT": str(out)}
    env.pop("FXFLOPS_FLUSH_S", None)
    proc = procs.popen([sys.executable, str(script), mode], stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    watchdog = threading.Timer(300, proc.kill)  # a readline that never returns, ended
    watchdog.start()
    try:
        while proc.stdout.readline().strip() != "ready":
            assert proc.poll() is None, "the host ended before it was ready"
    finally:
        watchdog.cancel()
    proc.send_signal(sig)
    rest, _ = procs.finish(proc, timeout=60)
    code = proc.returncode
    if sig == signal.SIGINT:
        assert "host saw KeyboardInterrupt" in rest and code == 0
    elif mode == "handler":
        assert "host handler ran" in rest and code == 0
    else:
        assert code == -signal.SIGTERM  # ended by the signal, as without fxflops
    (path,) = out.glob("fxflops-*.json")
    rows = fxflops.load_report(path)["graphs"][0]["rows"]
    assert {r["size"]: r["calls"] for r in rows} == {2: 2, 3: 1}


def test_peak_source_shows_in_the_report_title(tmp_path, capsys):
    data = _good_report()
    data["peak"] = {"tflops": 989.4, "gbps": 4800.0, "source": "table:H200:bf16"}
    (tmp_path / "r.json").write_text(json.dumps(data))
    code, out, err = cli(capsys, "report", str(tmp_path / "r.json"))
    assert code == 0 and "[table:H200:bf16]" in " ".join(out.split())
