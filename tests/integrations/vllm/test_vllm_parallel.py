"""vLLM beyond one worker, for real on CPU: pipeline parallelism (PP=2), data parallelism
(DP=2: two engines behind one server), and two "nodes" on localhost (vLLM's ``--nnodes 2``,
the second ``--headless``), each node with its own fxflops folder and its own exporter
(``FXFLOPS_PROMETHEUS_PORT``).

What is checked against what: the pipeline's FLOPs against the same model run as one
stage (PP=1) and against the analytic count; replicas' merged rows against each replica's
own; each node's /metrics against its reports. vLLM's memory-profiling forward is in no
table, counter or ``tune`` input, and is in the JSON with its ``profile`` marker.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from fxflops.outputs.prometheus import node_dir
from fxflops.report.files import load_reports
from fxflops.report.merge import merge_rows
from fxflops.report.rows import flat_rows
from fxflops.report.tuning import served_sizes
from tests import procs
from tests.helpers import dense_matmul_per_token
from tests.ports import free_port
from tests.vllm_server import Server, process_labels

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.vllm, pytest.mark.vllm_cpu]  # its engine


def run_tiny(out: Path, *extra: str) -> None:
    # FXFLOPS=1 around vLLM's eager backend: the Dynamo graphs and hooks of mode 2, without
    # an Inductor compile in every worker (2 cores)
    cmd = [sys.executable, str(ROOT / "examples" / "vllm_tiny.py"), str(out), "--backend",
           "eager", *extra]
    proc = procs.run(cmd, timeout=900, cwd=ROOT, env={**os.environ, "FXFLOPS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "generated [8, 8]" in proc.stdout


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """The same requests through two pipeline stages and through one."""
    pp2, pp1 = tmp_path_factory.mktemp("pp2"), tmp_path_factory.mktemp("pp1")
    run_tiny(pp2, "--pp", "2")
    run_tiny(pp1)
    return pp2, load_reports([pp2]), load_reports([pp1])


def static_flops(row: dict) -> int:
    return row["flops"] - row["runtime_flops"]


def test_pipeline_stages_report_apart(pipeline):
    folder, reports, _ = pipeline
    ranks = sorted((r["process"]["ranks"]["pp"], r["process"]["ranks"]["pp_size"],
                    r["process"]["rank"]) for r in reports)
    assert ranks == [(0, 2, 0), (1, 2, 1)]
    # one file per process, named by its global rank
    assert sorted(p.name.rsplit("-", 1)[1] for p in folder.glob("*.json")) == \
        ["rank0.json", "rank1.json"]


def test_pipeline_flops_per_decode_token_equal_one_stage(pipeline):
    _, reports, (pp1,) = pipeline
    merged = merge_rows(flat_rows(reports), reports[0]["peak"])
    # decode steps (the smallest size each run served: both requests decoding together;
    # the scheduler may batch them otherwise in a pipeline), per token
    pipe = min((r for r in merged if r["graph"] == "<pipeline>"), key=lambda r: r["size"])
    one = min(pp1["forward"], key=lambda r: r["size"])
    assert pipe["merged"]["stages"] == 2
    # the model's FLOPs, split over the stages, added up: the static ones exactly, with
    # attention (from the real context lengths) within 1%
    assert static_flops(pipe) / pipe["size"] == static_flops(one) / one["size"]
    per_token = pipe["flops"] / pipe["size"], one["flops"] / one["size"]
    assert abs(per_token[0] - per_token[1]) <= 0.01 * per_token[1]
    # and the stages' matmuls are the analytic model's (2 FLOPs a MAC)
    assert pipe["matmul_flops"] - pipe["runtime_flops"] == \
        pipe["size"] * dense_matmul_per_token()


def test_stage_rows_are_labelled(pipeline):
    folder, reports, _ = pipeline
    merged = merge_rows(flat_rows(reports), reports[0]["peak"])
    stages = {r["stage"] for r in merged if r.get("stage")}
    assert stages == {"pp0", "pp1"}
    # the stages are different parts of the model (a layer each), side by side; the
    # pipeline's row is their sum
    size = min(r["size"] for r in merged if r["graph"] == "<pipeline>")
    by_stage = {r["stage"]: r for r in merged if r.get("stage") and r["graph"] == "<forward>"
                and r["size"] == size}
    (whole,) = [r for r in merged if r["graph"] == "<pipeline>" and r["size"] == size]
    assert all(static_flops(r) > 0 for r in by_stage.values())
    assert static_flops(by_stage["pp0"]) + static_flops(by_stage["pp1"]) == static_flops(whole)
    out = procs.run([sys.executable, "-m", "fxflops.cli.main", "report", str(folder)],
                    env={**os.environ, "COLUMNS": "220"})
    assert out.returncode == 0, out.stderr
    for label in ("pp0", "pp1", "<pipeline>", "pipeline stages: work added"):
        assert label in out.stdout


def test_profile_run_is_warmup_not_traffic(pipeline):
    _, reports, _ = pipeline
    for rep in reports:
        profiled = {r["size"] for g in rep["graphs"] for r in g.get("warmup", [])
                    if r["warmup"] == "profile"}
        assert len(profiled) == 1  # the memory-profiling forward, max_num_batched_tokens
        served = {r["size"] for g in rep["graphs"] for r in g["rows"]} | \
            {r["size"] for r in rep["forward"]}
        assert not profiled & served
        assert not profiled & {s.size for s in served_sizes([rep])}
        # shown on request
        rows = flat_rows([rep], warmup=True)
        assert {r["size"] for r in rows if r.get("warmup") == "profile"} == profiled
    # and in the CLI: out of the default table, in the one --warmup asks for
    folder = pipeline[0]
    tables = [procs.run([sys.executable, "-m", "fxflops.cli.main", "report", str(folder),
                         *flag], env={**os.environ, "COLUMNS": "220"}) for flag in ([], ["--warmup"])]
    assert all(t.returncode == 0 for t in tables), [t.stderr for t in tables]
    assert "(profile)" not in tables[0].stdout and "(profile)" in tables[1].stdout


def test_tune_recommends_per_stage(pipeline):
    folder, _, _ = pipeline
    out = procs.run([sys.executable, "-m", "fxflops.cli.main", "tune", str(folder)],
                    env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "pipeline stage 0" in out.stdout and "pipeline stage 1" in out.stdout
    assert "the pipeline (2 stages" in out.stdout and "recommended:" in out.stdout


# --- data parallelism: two engines behind one server --------------------------------------


@pytest.fixture(scope="module")
def dp2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dp2")
    server = Server(folder, {"mode": 2, "backend": "eager"}, ["--data-parallel-size", "2"],
                    env_extra={"VLLM_CPU_OMP_THREADS_BIND": "0|1"})
    try:
        for _ in range(2):  # the API servers balance the requests over both engines
            server.complete([5, 9, 13, 17])  # (token ids stay within the tiny vocabulary)
        metrics, reports = server.settled()
    finally:
        server.stop()
    return metrics, reports


def test_dp_replicas_add_calls_not_flops_per_call(dp2):
    metrics, reports = dp2
    assert sorted((r["process"]["ranks"]["dp"], r["process"]["ranks"]["dp_size"])
                  for r in reports) == [(0, 2), (1, 2)]
    rows = flat_rows(reports)
    merged = {(r["graph"], r["size"]): r for r in merge_rows(rows, reports[0]["peak"])}
    own: dict = {}
    for r in rows:
        own.setdefault((r["graph"], r["size"]), []).append(r)
    both = [k for k, rs in own.items() if len(rs) == 2 and k[0] == "<forward>"]
    assert both  # a size both engines served
    for key in both:
        m, (a, b) = merged[key], own[key]
        assert m["calls"] == a["calls"] + b["calls"]
        assert static_flops(m) == static_flops(a) == static_flops(b)  # not doubled
        assert m["merged"]["replicas"] == 2
    # each engine's series apart, labelled by its replica
    for rep in reports:
        labels = process_labels(rep)
        assert labels["dp"] == str(rep["process"]["ranks"]["dp"])
        calls = sum(v for (name, lab), v in metrics.items()
                    if name == "fxflops_forward_calls_total" and dict(lab)["dp"] == labels["dp"])
        assert calls == sum(r["calls"] for r in rep["forward"])


# --- two nodes on localhost ---------------------------------------------------------------


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """vLLM's multi-node flags, TP=2 over two nodes of one worker each; the second node
    headless. Each node: its own FXFLOPS_OUT and exporter port."""
    master, ports = free_port(), [free_port(), free_port()]
    folders = [tmp_path_factory.mktemp(f"node{n}") for n in (0, 1)]
    common = ["--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", "127.0.0.1",
              "--master-port", str(master)]
    servers: list[Server] = []
    try:
        for node in (1, 0):  # the headless node first: node 0's API server waits for it
            env = {"FXFLOPS_PROMETHEUS_PORT": str(ports[node]),
                   "VLLM_CPU_OMP_THREADS_BIND": str(node)}
            servers.append(Server(folders[node], {"mode": 2, "backend": "eager"},
                                  [*common, "--node-rank", str(node)], env_extra=env,
                                  headless=node == 1))
        head, headless = servers[1], servers[0]
        head.complete([5, 9, 13])
        settled = [node_server.settled(f"http://127.0.0.1:{port}/metrics")
                   for node_server, port in ((head, ports[0]), (headless, ports[1]))]
    finally:
        for s in servers:
            s.stop()
        for port in ports:  # (each node's exporter folder, left by design for its next run)
            shutil.rmtree(node_dir(port), ignore_errors=True)
    return settled


def test_each_node_serves_its_counters_equal_to_its_report(two_nodes):
    run_ids = set()
    for node, (metrics, reports) in enumerate(two_nodes):
        (rep,) = reports
        ranks = rep["process"]["ranks"]
        assert (ranks["node"], ranks["nodes"], ranks["tp"], ranks["tp_size"]) == \
            (node, 2, node, 2)
        run_ids.add(rep["run"]["id"])
        labels = process_labels(rep)
        checked = 0
        for r in rep["forward"]:
            key = tuple(sorted({**labels, "size": str(r["size"])}.items()))
            assert metrics[("fxflops_forward_calls_total", key)] == r["calls"]
            assert metrics[("fxflops_forward_flops_total", key)] == r["total_flops"]
            checked += 1
        assert checked >= 2
        # only this node's processes
        assert {dict(k).get("node") for _, k in metrics} == {str(node)}
    assert len(run_ids) == 1  # the job's one run, though each node was started apart


def test_two_nodes_merge_as_tensor_parallel_shards(two_nodes):
    reports = [rep for _, (rep,) in two_nodes]
    # each node's report as it settled (flushed every second): the sizes both had written
    both = set.intersection(*({r["size"] for r in rep["forward"]} for rep in reports))
    merged = [r for r in merge_rows(flat_rows(reports), reports[0]["peak"])
              if r["graph"] == "<forward>" and r["size"] in both and isinstance(r["size"], int)]
    assert len(merged) >= 2
    for m in merged:  # the shards' parts add up to the whole model's
        assert m["merged"]["shards"] == 2
        assert m["matmul_flops"] - m["runtime_flops"] == m["size"] * dense_matmul_per_token()


# --- Ray: vLLM copies only the variables whose prefixes it lists -------------------------


def test_fxflops_settings_reach_ray_workers(monkeypatch):
    """Ray is not installed here: what vLLM hands its Ray workers is read from vLLM's own
    ``get_env_vars_to_copy``, after the plugin added fxflops' prefix to vLLM's own set of
    prefixes; the variable the user sets, part of vLLM's compile-cache key, is untouched."""
    from vllm.ray import ray_env
    from vllm.ray.ray_env import get_env_vars_to_copy

    from fxflops.integrations.vllm import hooks

    monkeypatch.setattr(ray_env, "DEFAULT_ENV_VAR_PREFIXES",
                        set(ray_env.DEFAULT_ENV_VAR_PREFIXES))
    monkeypatch.setenv("FXFLOPS", "1")
    monkeypatch.setenv("FXFLOPS_OUT", "/reports")
    monkeypatch.setenv("MYORG_SETTING", "x")
    monkeypatch.setenv("VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY", "MYORG_")
    assert "FXFLOPS_OUT" not in get_env_vars_to_copy()  # vLLM's default: not copied
    hooks.settings_reach_ray_workers()
    hooks.settings_reach_ray_workers()  # idempotent
    copied = get_env_vars_to_copy()
    assert {"FXFLOPS", "FXFLOPS_OUT", "MYORG_SETTING"} <= copied
    assert os.environ["VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"] == "MYORG_"
