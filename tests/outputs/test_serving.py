"""Serving: fxflops' counters in a real ``vllm serve``'s /metrics, padding, ``fxflops tune``.

Two real servers of a tiny dummy-weight Llama on CPU, each started once for the module:
one API server (fxflops collects the workers' files into vLLM's registry), then two API
servers (vLLM's own multi-process collection) started with the ``-cc`` that
``fxflops tune`` printed for the first server's run. Requests go over HTTP; /metrics is
parsed with prometheus_client's own parser and checked against the run's report.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

import fxflops
from fxflops.outputs.prometheus import RecorderCollector, write_files
from tests import procs
from tests.vllm_server import Server, process_labels

ROOT = Path(__file__).resolve().parents[2]


# --- label cardinality and the two sinks (no vLLM) --------------------------------------


def test_five_thousand_sizes_stay_a_bounded_label_set(tmp_path, monkeypatch):
    import torch
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector
    from prometheus_client.parser import text_string_to_metric_families

    monkeypatch.setenv("FXFLOPS_PROMETHEUS_SIZES", "16")
    compiled = torch.compile(torch.nn.Linear(4, 4), backend=fxflops.backend(inner="eager"),
                             dynamic=True)
    with torch.no_grad():
        for size in range(2, 5002):
            compiled(torch.randn(size, 4))
    [graph] = fxflops.recorder().graphs
    assert len(graph.rows) == 5000

    registry = CollectorRegistry()
    registry.register(RecorderCollector(fxflops.recorder()))
    folder = tmp_path / "prom"
    folder.mkdir()
    write_files(fxflops.recorder(), str(folder))
    from_files = CollectorRegistry()
    MultiProcessCollector(from_files, path=str(folder))
    for source in (registry, from_files):
        families = {f.name: f for f in
                    text_string_to_metric_families(generate_latest(source).decode())}
        calls = families["fxflops_graph_calls"].samples
        assert len(calls) == 17  # 16 sizes of their own + "other", not 5,000
        assert sum(s.value for s in calls) == 5000  # every call still counted
        other = [s for s in calls if s.labels["size"] == "other"]
        assert other and other[0].value == 5000 - 16
        flops = sum(s.value for s in families["fxflops_graph_flops"].samples)
        # addmm by hand: 2 n·4·4 (torch's convention: the bias add comes with the product)
        assert flops == sum(2 * 4 * 4 * n for n in range(2, 5002))


def test_node_exporter_serves_its_folder_once_per_port(tmp_path, monkeypatch):
    """FXFLOPS_PROMETHEUS_PORT: the first process to bind serves every fxflops file of the
    node's folder; another process finds the port taken and only writes; files of dead
    processes (an earlier run's) are removed when the exporter starts."""
    import torch

    from fxflops.outputs import prometheus as metrics
    from tests.ports import free_port
    from tests.vllm_server import scrape

    port = free_port()
    folder = tmp_path / "node"
    monkeypatch.setenv("FXFLOPS_PROMETHEUS_PORT", str(port))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setenv("FXFLOPS_PROMETHEUS_DIR", str(folder))
    folder.mkdir()
    dead = procs.run([sys.executable, "-c", "import os; print(os.getpid())"]).stdout.strip()
    (folder / f"counter_fxflops-{dead}.db").write_bytes(b"")  # an earlier run's
    compiled = torch.compile(torch.nn.Linear(4, 4), backend=fxflops.backend(inner="eager"))
    with torch.no_grad():
        compiled(torch.randn(3, 4))
    assert metrics.files_dir() == str(folder)
    write_files(fxflops.recorder(), str(folder))
    assert metrics.serve_node() is True
    try:
        assert not (folder / f"counter_fxflops-{dead}.db").exists()
        got = scrape(f"http://127.0.0.1:{port}/metrics")
        calls = [v for (name, _), v in got.items() if name == "fxflops_graph_calls_total"]
        assert calls == [1.0]
        # addmm by hand: 2 * 3 * 4 * 4
        assert [v for (name, _), v in got.items() if name == "fxflops_graph_flops_total"] == \
            [2 * 3 * 4 * 4]
        # a second process of the node: the port is taken, it says nothing and writes on
        taken = procs.run([sys.executable, "-c", "from fxflops.outputs import prometheus as metrics; "
                           "print(metrics.serve_node())"],
                          env={**os.environ, "FXFLOPS_PROMETHEUS_PORT": str(port)})
        assert taken.stdout.strip() == "False" and "cannot serve" not in taken.stderr
        assert "fxflops" not in taken.stderr  # the exporter is the node's: nothing to say
    finally:
        metrics.stop_serving(port)


def test_a_port_another_program_holds_is_warned_about_once(tmp_path, monkeypatch,
                                                           fxflops_log):
    """A port held by something other than the node's exporter (here a bare listener, as a
    gloo rank's is): no exporter, and one line that says so, an earlier run's lock file in
    the folder or not. Once the port is free, the next flush serves it and holds the
    folder's lock, which another process of the node then cannot take."""
    import fcntl
    import socket

    from fxflops.outputs import prometheus as metrics
    from tests.ports import free_port

    port = free_port()
    folder = tmp_path / "node"
    folder.mkdir()
    monkeypatch.setenv("FXFLOPS_PROMETHEUS_PORT", str(port))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setenv("FXFLOPS_PROMETHEUS_DIR", str(folder))
    lock = folder / f"exporter-{port}.lock"
    lock.write_text("")  # an earlier run's exporter's, released when it ended
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        assert metrics.serve_node() is False
        assert metrics.serve_node() is False  # the next flush: tried again, not warned again
    lines = [r.getMessage() for r in fxflops_log.records]
    assert len(lines) == 1, lines
    assert f"port {port} is taken by a program that is not this node's fxflops exporter" \
        in lines[0] and str(folder) in lines[0] and "\n" not in lines[0]
    try:
        assert metrics.serve_node() is True
        with open(lock) as other:  # another open file: as another process would take it
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        metrics.stop_serving(port)
    with open(lock) as other:  # released with the exporter
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


# --- real servers -------------------------------------------------------------------------


def check_metrics_equal_report(metrics: dict, reports: list[dict]) -> int:
    """Every graph and size the report lists has its counters, with equal values; and
    /metrics has no fxflops series the report does not. Returns the series checked."""
    seen = set()

    def expect(name: str, labels: dict, value: float, exact: bool = True) -> None:
        key = (name, tuple(sorted(labels.items())))
        assert key in metrics, f"{key} missing from /metrics"
        got = metrics[key]
        assert got == value if exact else got == pytest.approx(value, rel=1e-9, abs=1e-9), \
            (key, got, value)
        seen.add(key)

    for rep in reports:
        rows = [("fxflops_graph", {"graph": g["name"]}, r) for g in rep["graphs"]
                for r in g["rows"]] + [("fxflops_forward", {}, r) for r in rep["forward"]]
        for prefix, labels, r in rows:
            labels = {**labels, "size": str(r["size"]), **process_labels(rep)}
            expect(f"{prefix}_calls_total", labels, r["calls"])
            expect(f"{prefix}_flops_total", labels, r["total_flops"])
            expect(f"{prefix}_matmul_flops_total", labels, r["total_matmul_flops"])
            expect(f"{prefix}_bytes_total", labels, r["total_bytes"])
            expect(f"{prefix}_seconds_total", labels, r["total_ms"] / 1e3, exact=False)
            if prefix == "fxflops_forward":
                expect("fxflops_forward_tokens_total", labels, r["size"] * r["calls"])
                expect("fxflops_forward_scheduled_tokens_total", labels, r["scheduled_tokens"])
    extra = {k for k in metrics if k not in seen and not k[0].startswith("fxflops_peak")}
    assert not extra, f"series not in the report: {sorted(extra)[:5]}"
    return len(seen)


@pytest.fixture(scope="module")
def padded_server(tmp_path_factory):
    """One API server whose steps vLLM pads as under CUDA graphs (tests/padding_plugin:
    its dispatcher pads to multiples of 8; CUDA graphs cannot run on CPU)."""
    folder = tmp_path_factory.mktemp("serve1")
    path = os.pathsep.join(p for p in (str(ROOT / "tests" / "padding_plugin"),
                                       os.environ.get("PYTHONPATH")) if p)
    server = Server(folder, {"mode": 2, "backend": "eager"}, env_extra={"PYTHONPATH": path})
    try:
        tokens = server.complete([5, 13, 20]) + server.complete([7])
        metrics, reports = server.settled()
        server.vllm_metrics = server.scrape("vllm:")  # vLLM's own, for an independent check
    finally:
        server.stop()
    return server, metrics, reports, tokens


@pytest.mark.vllm
@pytest.mark.vllm_cpu
def test_metrics_of_a_real_server_equal_its_report(padded_server):
    server, metrics, reports, _ = padded_server
    assert len(reports) == 1
    checked = check_metrics_equal_report(metrics, reports)
    forwards = reports[0]["forward"]
    assert sum(r["calls"] for r in forwards) >= 4 and checked >= 10 * len(forwards)


@pytest.mark.vllm
@pytest.mark.vllm_cpu
def test_scheduled_tokens_equal_vllm_own_counters(padded_server):
    """An independent reference: vLLM's own metrics. Its histogram of tokens per engine step
    sums every step's computed prompt tokens and generated tokens; a request's last token is
    generated but never fed to a forward, so the tokens the forwards were given are that sum
    less one per finished request."""
    server, metrics, _, _ = padded_server
    vllm_metrics = server.vllm_metrics
    per_step = sum(v for (name, _), v in vllm_metrics.items()
                   if name == "vllm:iteration_tokens_total_sum")
    finished = sum(v for (name, _), v in vllm_metrics.items()
                   if name == "vllm:request_success_total")
    scheduled = sum(v for (name, _), v in metrics.items()
                    if name == "fxflops_forward_scheduled_tokens_total")
    assert finished == 4 and per_step > 0  # the fixture sent 3 + 1 requests
    assert scheduled == per_step - finished


@pytest.mark.vllm
@pytest.mark.vllm_cpu
def test_padding_waste_equals_the_hand_computed_one(padded_server):
    server, metrics, [report], tokens = padded_server
    forwards = {r["size"]: r for r in report["forward"]}
    # every step's tokens, scheduled and run: all the requests' tokens, nothing else
    assert sum(r["scheduled_tokens"] for r in forwards.values()) == tokens
    assert any(r["padding_tokens"] for r in forwards.values())
    for size, r in forwards.items():
        scheduled = {int(n): c for n, c in r["scheduled"].items()}
        # by hand: each step padded to the next multiple of 8, the rest is waste
        assert all(size == -(-n // 8) * 8 for n in scheduled), (size, scheduled)
        waste = sum(c * (size - n) for n, c in scheduled.items())
        assert r["padding_tokens"] == waste
        assert r["padding_share"] == waste / (size * r["calls"])
        # the tiny Llama's FLOPs per forward are proportional to its tokens (every op of
        # its graph is per token, by hand): the FLOPs wasted are the tokens wasted
        assert r["padding_flops_share"] == pytest.approx(waste / (size * r["calls"]), rel=1e-3)
        assert r["padding_ms"] == pytest.approx(r["median_ms"] * r["padding_flops_share"],
                                                rel=1e-9)
        # and /metrics counts the same tokens
        labels = tuple(sorted({"size": str(size), **process_labels(report)}.items()))
        assert metrics[("fxflops_forward_tokens_total", labels)] == size * r["calls"]
        assert metrics[("fxflops_forward_scheduled_tokens_total", labels)] == \
            r["scheduled_tokens"]


@pytest.mark.vllm
@pytest.mark.vllm_cpu
def test_profile_run_is_in_no_table_counter_or_tune_input(padded_server):
    """vLLM's memory-profiling forward (max_num_batched_tokens: 2048 here) is warm-up: in
    the JSON with its marker, and nowhere traffic is counted."""
    from fxflops.report.rows import flat_rows
    from fxflops.report.tuning import served_sizes

    _, metrics, reports, _ = padded_server
    (report,) = reports
    profiled = {r["size"] for g in report["graphs"] for r in g.get("warmup", [])
                if r["warmup"] == "profile"}
    assert profiled == {2048}
    assert all(r["size"] != 2048 for r in flat_rows(reports))
    assert 2048 not in {s.size for s in served_sizes(reports)}
    assert not any(dict(labels).get("size") == "2048" for _, labels in metrics)
    assert any(r["size"] == 2048 for r in flat_rows(reports, warmup=True))


@pytest.fixture(scope="module")
def tuned_two_api_servers(padded_server, tmp_path_factory):
    """``fxflops tune`` on the first server's run, then a server started with its -cc."""
    server = padded_server[0]
    proc = procs.run([sys.executable, "-m", "fxflops.cli.main", "tune", str(server.out)],
                     timeout=120)
    assert proc.returncode == 0, proc.stderr
    snippet = re.search(r"-cc '(\{.*\})'", proc.stdout)
    assert snippet, proc.stdout
    cc = {"mode": 2, "backend": "eager", **json.loads(snippet.group(1))}
    folder = tmp_path_factory.mktemp("serve2")
    second = Server(folder, cc, ["--api-server-count", "2"])
    try:
        second.complete([6, 9])
        metrics, reports = second.settled()
        again = second.scrape()  # either API server answers from every process's files
    finally:
        second.stop()
    return cc, metrics, again, reports, second


@pytest.mark.vllm
@pytest.mark.vllm_cpu
def test_tune_snippet_starts_vllm_and_two_api_servers_show_the_metrics(tuned_two_api_servers):
    cc, metrics, again, reports, second = tuned_two_api_servers
    # what tune recommended, in the compilation config vLLM's engine started with
    assert cc["compile_sizes"] and f"'compile_sizes': {cc['compile_sizes']}" in second.text()
    check_metrics_equal_report(metrics, reports)
    assert {k: v for k, v in again.items() if "calls" in k[0]} == \
        {k: v for k, v in metrics.items() if "calls" in k[0]}
    # CPU without the padding plugin: vLLM pads nothing, and the report says so
    assert all(r["padding_tokens"] == 0 and r["scheduled_tokens"] == r["size"] * r["calls"]
               for rep in reports for r in rep["forward"])
