"""Distributed training on gloo (CPU), for real: two ranks under ``torchrun``
(``tests/dist_train.py``), compiled with fxflops and, for the losses, with Inductor alone.

- DDP, ``torch.compile(DDP(model))``, run as two torchrun "nodes" of one process each on
  localhost (``--nnodes 2 --node-rank 0|1``), each with its own ``FXFLOPS_OUT`` and its own
  exporter (``FXFLOPS_PROMETHEUS_PORT``): Dynamo's DDP optimizer splits the graph at the
  gradient buckets, and every piece is counted.
- FSDP2 with per-block compile, two ranks on one node, one exporter for both: the
  all-gathers and reduce-scatters outside the graphs are counted apart.

Each run's per-rank step is checked against FlopCounterMode on that rank's eager step, the
merged step against the sum of the ranks' by hand, and the /metrics of each node against
its reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fxflops.report.files import load_reports
from fxflops.report.merge import merge_steps
from fxflops.report.rows import flat_rows
from fxflops.report.steps import training_steps
from tests import procs
from tests.ports import free_port

SCRIPT = str(Path(__file__).resolve().parents[2] / "tests" / "dist_train.py")
ROOT = str(Path(__file__).resolve().parents[2])
BLOCKS, WIDTH = 3, 512  # dist_train.Net
PEAK_TFLOPS = 1.0
HOLD_S = 60


def torchrun(args: list[str], env: dict[str, str], nodes: int = 1, node_rank: int = 0,
             master_port: int | None = None, nproc: int = 2) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    if nodes > 1:
        cmd += ["--nnodes", str(nodes), "--node-rank", str(node_rank), "--master-addr",
                "127.0.0.1", "--master-port", str(master_port)]
    else:
        cmd += ["--master-port", str(master_port or free_port())]
    return cmd + [SCRIPT, *args]


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXFLOPS")}
    env.update(PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""), OMP_NUM_THREADS="1",
               FXFLOPS_PEAK_TFLOPS=str(PEAK_TFLOPS), **extra)
    return env


def run_plain(tmp: Path, wrap: str) -> dict[int, dict]:
    """The same job compiled by Inductor alone: the losses fxflops must not change."""
    out = tmp / f"{wrap}-inductor"
    result = procs.run(torchrun(["--wrap", wrap, "--backend", "inductor", "--out", str(out)],
                                base_env()), env=base_env(), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return ranks_written(out)


def ranks_written(out: Path) -> dict[int, dict]:
    return {d["rank"]: d for d in (json.loads(f.read_text()) for f in out.glob("rank*.json"))}


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def wait_for(paths: list[Path], procs_: list, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while not all(p.exists() for p in paths):
        for p in procs_:
            if p.poll() is not None and p.returncode != 0:
                raise AssertionError(f"{p.args} failed: {procs.finish(p)[1][-3000:]}")
        assert time.time() < deadline, f"{paths} never written"
        time.sleep(0.5)


def held(out: Path, ranks: int) -> list[Path]:
    """The files a rank writes once it trained and flushed (then it holds)."""
    return [out / f"rank{r}.json" for r in range(ranks)]


def scrape_held(out: Path, ranks: int, started: list, ports: list[int]) -> list[dict]:
    """Each exporter's /metrics while the job's ``ranks`` hold, then the job stopped; a
    scrape that fails says what the job printed. Every node's port is served by one of its
    ranks: none warns that its port is taken or cannot be served."""
    error: Exception | None = None
    try:
        wait_for(held(out, ranks), started)
        time.sleep(1)  # the flush that follows the rank's file
        scraped = [scrape(port) for port in ports]
    except Exception as e:  # refused, timed out, not HTTP, not Prometheus' text
        error = e
    finally:
        for p in started:
            p.terminate()
        printed = [procs.finish(p, timeout=120) for p in started]
    if error is not None:
        raise AssertionError(f"scraping {ports}: {error!r}; the job's stderr:\n" + "\n".join(
            err[-3000:] for _, err in printed)) from error
    for _, err in printed:
        assert "not this node's fxflops exporter" not in err and "cannot serve" not in err, \
            err[-3000:]
    return scraped


@pytest.fixture(scope="module")
def ddp_two_nodes(tmp_path_factory):
    """DDP as two torchrun nodes of one rank each: reports, the exporters' /metrics while
    the ranks hold, and the losses of the same job without fxflops."""
    tmp = tmp_path_factory.mktemp("ddp")
    master, ports = free_port(), [free_port(), free_port()]
    out = tmp / "ranks"
    started = []
    for node in (0, 1):
        env = base_env(FXFLOPS_OUT=str(tmp / f"node{node}"), FXFLOPS_PROMETHEUS="1",
                       FXFLOPS_PROMETHEUS_PORT=str(ports[node]),
                       FXFLOPS_PROMETHEUS_DIR=str(tmp / f"metrics{node}"))
        cmd = torchrun(["--wrap", "ddp", "--out", str(out), "--hold", str(HOLD_S)], env,
                       nodes=2, node_rank=node, master_port=master, nproc=1)
        started.append(procs.popen(cmd, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE))
    metrics = scrape_held(out, 2, started, ports)
    reports = [load_reports([tmp / f"node{node}"]) for node in (0, 1)]
    return {"reports": reports, "metrics": metrics, "ranks": ranks_written(out),
            "plain": run_plain(tmp, "ddp"), "tmp": tmp}


@pytest.fixture(scope="module")
def fsdp_one_node(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    port = free_port()
    out = tmp / "ranks"
    env = base_env(FXFLOPS_OUT=str(tmp / "out"), FXFLOPS_PROMETHEUS="1",
                   FXFLOPS_PROMETHEUS_PORT=str(port),
                   FXFLOPS_PROMETHEUS_DIR=str(tmp / "metrics"))
    proc = procs.popen(torchrun(["--wrap", "fsdp", "--out", str(out), "--hold", str(HOLD_S)],
                                env), env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    (metrics,) = scrape_held(out, 2, [proc], [port])
    return {"reports": load_reports([tmp / "out"]), "metrics": metrics,
            "ranks": ranks_written(out), "plain": run_plain(tmp, "fsdp"), "tmp": tmp}


def step_of(report: dict) -> dict:
    (step,) = report["steps"]
    return step


def test_ddp_every_bucket_piece_is_counted_and_each_rank_equals_flop_counter(ddp_two_nodes):
    for (rep,) in ddp_two_nodes["reports"]:
        rank = rep["process"]["rank"]
        forwards = [g for g in rep["graphs"] if (g.get("meta") or {}).get("phase") == "forward"]
        # Dynamo's DDP optimizer: one piece per bucket (1 MB: one linear layer each)
        assert sorted(g["meta"]["piece"] for g in forwards) == list(range(BLOCKS))
        step = step_of(rep)
        assert step["steps"] == 3
        assert step["matmul_flops"] == ddp_two_nodes["ranks"][rank]["eager_step_flops"]
        # by hand: forward 3 x 2*16*512*512; backward: weight grads of 3, input grads of 2
        assert step["matmul_flops"] == (3 + 3 + 2) * 2 * 16 * WIDTH * WIDTH


def test_ddp_losses_are_bit_identical_without_fxflops(ddp_two_nodes):
    got, plain = ddp_two_nodes["ranks"], ddp_two_nodes["plain"]
    assert set(got) == set(plain) == {0, 1}
    for rank in got:
        assert got[rank]["losses"] == plain[rank]["losses"]


def test_ddp_ranks_nodes_and_one_run(ddp_two_nodes):
    processes = sorted((rep["process"] for (rep,) in ddp_two_nodes["reports"]),
                       key=lambda p: p["rank"])
    assert [(p["rank"], p["ranks"]["world"], p["ranks"]["node"], p["ranks"]["nodes"])
            for p in processes] == [(0, 2, 0, 2), (1, 2, 1, 2)]
    # one run: the job's store gave every rank the same id
    assert len({rep["run"]["id"] for (rep,) in ddp_two_nodes["reports"]}) == 1


def test_merged_step_is_the_sum_of_the_ranks(ddp_two_nodes):
    reports = [rep for (rep,) in ddp_two_nodes["reports"]]
    steps = training_steps(flat_rows(reports), reports[0]["peak"])
    assert len(steps) == 2
    (merged,) = merge_steps(steps, reports[0]["peak"])
    assert merged["ranks"] == 2
    assert merged["flops"] == sum(s["flops"] for s in steps)
    assert merged["matmul_flops"] == sum(ddp_two_nodes["ranks"][r]["eager_step_flops"]
                                        for r in (0, 1))
    slowest = max(s["step_ms"] for s in steps)
    assert merged["step_ms"] == slowest
    # MFU over all ranks' devices, by hand
    assert merged["mfu"] == pytest.approx(
        merged["matmul_flops"] / (slowest / 1e3) / (2 * PEAK_TFLOPS * 1e12), rel=1e-9)


def test_each_node_exporter_serves_its_ranks_counters(ddp_two_nodes):
    for node, ((rep,), metrics) in enumerate(zip(ddp_two_nodes["reports"],
                                                 ddp_two_nodes["metrics"])):
        rank = str(rep["process"]["rank"])
        checked = 0
        for g in rep["graphs"]:
            for r in g["rows"]:
                labels = tuple(sorted({"graph": g["name"], "size": str(r["size"]),
                                       "rank": rank, "node": str(node)}.items()))
                assert metrics[("fxflops_graph_calls_total", labels)] == r["calls"]
                assert metrics[("fxflops_graph_flops_total", labels)] == r["total_flops"]
                checked += 1
        assert checked == 2 * BLOCKS
        # the other node's rank is not here: each node serves its own
        assert not any(dict(labels).get("rank") not in (None, rank)
                       for (_, labels) in metrics)


def test_cli_reads_both_nodes_and_merges_the_step(ddp_two_nodes):
    tmp = ddp_two_nodes["tmp"]
    result = procs.run([sys.executable, "-m", "fxflops.cli.main", "report", str(tmp / "node0"),
                        str(tmp / "node1")], env={**os.environ, "COLUMNS": "250"})
    assert result.returncode == 0, result.stderr
    assert "all (2 ranks)" in result.stdout
    assert "rank0" in result.stdout and "rank1" in result.stdout


def test_fsdp_each_rank_equals_flop_counter_and_losses_are_unchanged(fsdp_one_node):
    reports = fsdp_one_node["reports"]
    assert sorted(rep["process"]["rank"] for rep in reports) == [0, 1]
    for rep in reports:
        rank = rep["process"]["rank"]
        # per-block compile: the blocks' graphs run every step, each counted
        assert step_of(rep)["matmul_flops"] == fsdp_one_node["ranks"][rank]["eager_step_flops"]
        assert fsdp_one_node["ranks"][rank]["losses"] == fsdp_one_node["plain"][rank]["losses"]
    # the job's step: both ranks' work (FlopCounterMode's per rank), the slower's time
    steps = training_steps(flat_rows(reports), reports[0]["peak"])
    (merged,) = merge_steps(steps, reports[0]["peak"])
    assert merged["ranks"] == 2
    assert merged["matmul_flops"] == sum(fsdp_one_node["ranks"][r]["eager_step_flops"]
                                         for r in (0, 1))
    assert merged["step_ms"] == max(s["step_ms"] for s in steps)


def test_fsdp_collectives_are_counted_apart(fsdp_one_node):
    buffer = (WIDTH * WIDTH + WIDTH) * 4  # a block's parameters, unsharded (fp32)
    for rep in fsdp_one_node["reports"]:
        steps = step_of(rep)["steps"]
        # per step and block: gathered before its forward and again before its backward
        # (resharded after the forward), its gradients reduce-scattered once
        assert rep["collectives"] == {
            "all_gather": {"calls": 2 * BLOCKS * steps, "bytes": 2 * BLOCKS * steps * buffer},
            "reduce_scatter": {"calls": BLOCKS * steps, "bytes": BLOCKS * steps * buffer}}
        assert step_of(rep)["collective_bytes"] == 3 * BLOCKS * buffer


def test_one_exporter_serves_both_ranks_of_its_node(fsdp_one_node):
    metrics = fsdp_one_node["metrics"]
    for rep in fsdp_one_node["reports"]:
        rank = str(rep["process"]["rank"])
        calls = sum(v for (name, labels), v in metrics.items()
                    if name == "fxflops_graph_calls_total" and dict(labels)["rank"] == rank)
        assert calls == sum(r["calls"] for g in rep["graphs"] for r in g["rows"])


DDP_OF_SEQUENTIAL = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
ddp = torch.nn.parallel.DistributedDataParallel(model)
compiled = torch.compile(ddp, backend=os.environ["BACKEND"])
for _ in range(2):
    compiled(torch.randn(4, 64)).sum().backward()
dist.destroy_process_group()
"""


@pytest.mark.parametrize("wrap", ["ddp_of_container", "ddp_of_compiled"])
def test_ddp_of_a_container_is_said_and_the_fix_counts(wrap, tmp_path):
    """torch.compile(DDP(nn.Sequential)): Dynamo compiles nothing (torch's own frames are
    skipped inside DDP): said once at exit, with the fix; the fix compiles and counts."""
    code = DDP_OF_SEQUENTIAL
    if wrap == "ddp_of_compiled":
        code = code.replace("DistributedDataParallel(model)",
                            "DistributedDataParallel(torch.compile(model, backend='fxflops'))")
        code = code.replace("compiled = torch.compile(ddp, backend=os.environ[\"BACKEND\"])",
                            "compiled = ddp")
    code += "import fxflops; print('graphs', len(fxflops.recorder().graphs))\n"
    env = base_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), BACKEND="fxflops")
    result = procs.run([sys.executable, "-c", code], env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    said = "compiled no graph" in result.stderr and "DDP(torch.compile(model" in result.stderr
    if wrap == "ddp_of_container":
        assert "graphs 0" in result.stdout and said
    else:  # forward and backward of the compiled model: counted, nothing said
        assert "graphs 2" in result.stdout and not said
