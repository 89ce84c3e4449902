"""Report rows: single and merged rows computed by the same throughput(); what fxflops
writes passes the checks at load, numbers included."""

from __future__ import annotations

import json

import pytest
import torch

import fxflops
from fxflops.report.files import load_report
from fxflops.report.merge import describe, merge_rows
from fxflops.report.schema import ReportError, validate


def _row(rank, flops, matmul, bytes_io, median_ms, calls):
    return {"rank": rank, "pid": 100 + rank, "graph": "model0", "size": 8, "key": [8],
            "calls": calls, "total_ms": median_ms * calls, "median_ms": median_ms,
            "p10_ms": median_ms * 0.9, "p90_ms": median_ms * 1.1, "flops": flops,
            "matmul_flops": matmul, "runtime_flops": 10, "bytes_io": bytes_io,
            "bytes_nodes": 2 * bytes_io, "gflops": flops / 1e9}


def test_two_ranks_merge_every_figure():
    peak = {"tflops": 100.0, "gbps": 1000.0, "source": "env"}
    rank0 = _row(0, flops=6e9, matmul=5e9, bytes_io=2e9, median_ms=4.0, calls=10)
    rank1 = _row(1, flops=6e9, matmul=5e9, bytes_io=2e9, median_ms=5.0, calls=10)
    (m,) = merge_rows([rank0, rank1], peak)
    assert m["rank"] == "all" and m["ranks"] == 2
    assert m["calls"] == 20 and m["total_ms"] == 90.0
    assert m["flops"] == 12e9 and m["matmul_flops"] == 10e9 and m["bytes_io"] == 4e9
    assert m["bytes_nodes"] == 8e9 and m["runtime_flops"] == 20 and m["gflops"] == 12.0
    assert m["median_ms"] == 5.0 and m["p90_ms"] == 5.5 and m["p10_ms"] == 4.5  # slowest rank
    # by hand: 12 GFLOP in 5 ms over two devices of 100 TFLOP/s and 1000 GB/s each
    assert m["tflops"] == pytest.approx(12e9 / 5e-3 / 1e12)
    assert m["gbps"] == pytest.approx(4e9 / 5e-3 / 1e9)
    assert m["mfu"] == pytest.approx(10e9 / 5e-3 / (2 * 100e12))
    assert m["intensity"] == pytest.approx(3.0)
    # by hand: 12 GFLOP at 200 TFLOP/s take 0.06 ms, 4 GB at 2000 GB/s take 2 ms
    assert m["bound"] == "memory"
    assert m["roofline_ms"] == pytest.approx(2.0)
    assert m["roofline_share"] == pytest.approx(2.0 / 5.0)


def test_merged_rows_add_timed_calls_and_run_time_totals():
    """Shards (two ranks) and processes of one rank: calls timed, calls lost and the
    run-time totals add like the calls (a CPU samples calls: timed differs from calls)."""
    rank0 = {**_row(0, flops=6e9, matmul=5e9, bytes_io=2e9, median_ms=4.0, calls=100),
             "timed_calls": 21, "lost_samples": 0, "total_runtime_flops": 700,
             "total_runtime_bytes": 70}
    rank1 = {**rank0, "rank": 1, "pid": 101, "timed_calls": 22, "lost_samples": 3,
             "total_runtime_flops": 900, "total_runtime_bytes": 90}
    (m,) = merge_rows([rank0, rank1])
    assert (m["calls"], m["timed_calls"], m["lost_samples"]) == (200, 43, 3)
    assert (m["total_runtime_flops"], m["total_runtime_bytes"]) == (1600, 160)
    (m,) = merge_rows([rank0, {**rank1, "rank": 0, "pid": 7}])
    assert (m["calls"], m["timed_calls"], m["total_runtime_flops"]) == (200, 43, 1600)


def test_two_processes_of_one_rank_add_calls_not_work():
    a = _row(0, flops=6e9, matmul=5e9, bytes_io=2e9, median_ms=4.0, calls=10)
    b = {**_row(0, flops=6e9, matmul=5e9, bytes_io=2e9, median_ms=3.0, calls=5), "pid": 7}
    (m,) = merge_rows([a, b])
    assert m["ranks"] == 1 and m["calls"] == 15 and m["flops"] == 6e9
    assert m["mfu"] is None and m["tflops"] == pytest.approx(6e9 / 4e-3 / 1e12)


def test_replicas_of_a_tensor_parallel_pipeline_merge_by_hand():
    """dp 2 x pp 2 x tp 2: shards add work and wait for the slowest, stages sit side by
    side and add into the pipeline, replicas add calls (figures by hand)."""
    peak = {"tflops": 100.0, "gbps": 1000.0, "source": "env"}
    work = {0: (3e9, 1e9), 1: (5e9, 2e9)}  # per shard of a stage: FLOPs, bytes
    ms = {(0, 0, 0): 2.0, (0, 0, 1): 3.0, (0, 1, 0): 4.0, (0, 1, 1): 4.5,
          (1, 0, 0): 2.5, (1, 0, 1): 2.5, (1, 1, 0): 5.5, (1, 1, 1): 5.5}
    rows = []
    for (dp, pp, tp), median in ms.items():
        flops, nbytes = work[pp]
        row = _row(0, flops=flops, matmul=flops, bytes_io=nbytes, median_ms=median,
                   calls=10 if dp == 0 else 30)
        row.update(graph="<forward>", dp=dp, pp=pp, tp=tp, dp_size=2, pp_size=2, tp_size=2,
                   pid=1000 + 4 * dp + 2 * pp + tp, run="r")
        rows.append(row)
    merged = merge_rows(rows, peak)
    stage = {r["stage"]: r for r in merged if r.get("stage")}
    (pipe,) = [r for r in merged if r["graph"] == "<pipeline>"]
    assert stage["pp0"]["flops"] == 6e9 and stage["pp1"]["flops"] == 10e9
    assert stage["pp0"]["calls"] == stage["pp1"]["calls"] == 80  # 2 shards x (10 + 30)
    # a replica's stage time is its slowest shard's; replicas: a calls-weighted mean
    assert stage["pp0"]["median_ms"] == pytest.approx((3.0 * 20 + 2.5 * 60) / 80)
    assert stage["pp1"]["median_ms"] == pytest.approx((4.5 * 20 + 5.5 * 60) / 80)
    # the pipeline: per replica, its stages' work and times added (7.5 ms and 8.0 ms)
    assert pipe["flops"] == 16e9 and pipe["bytes_io"] == 6e9
    assert pipe["median_ms"] == pytest.approx((7.5 * 20 + 8.0 * 60) / 80)
    assert pipe["calls"] == 80
    # MFU against one replica's 4 devices of 100 TFLOP/s
    assert pipe["mfu"] == pytest.approx(16e9 / (pipe["median_ms"] / 1e3) / (4 * 100e12))
    assert {k: pipe["merged"][k] for k in ("shards", "stages", "replicas")} == \
        {"shards": 2, "stages": 2, "replicas": 2}
    lines = describe(merged)
    assert any(line.startswith("merged (2 shard(s) x 2 stage(s) x 2 replica(s)): ")
               and "pipeline stages" in line for line in lines), lines


def test_what_fxflops_writes_passes_the_checks_at_load(tmp_path):
    """A training step (forward and backward graphs: phase, source, frame) and a vLLM-style
    whole forward (padding, scheduled tokens, captured replays), saved and loaded back."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    compiled = torch.compile(model, backend=fxflops.backend(inner="aot_eager"), dynamic=True)
    for batch in (2, 3, 2):
        compiled(torch.randn(batch, 8)).sum().backward()
    rec = fxflops.recorder()
    forward = rec.forward_row(8)
    for tokens in (5, 8, 8):
        forward.add(1_000_000)
        forward.forward.note_scheduled(tokens)
    forward.forward.captured = 2
    path = rec.save(tmp_path / "r.json")
    report = load_report(path)
    phases = sorted(g["meta"].get("phase") for g in report["graphs"])
    assert phases == ["backward", "forward"] and report["steps"]
    (fwd,) = report["forward"]
    assert fwd["scheduled"] == {"5": 1, "8": 2} and fwd["padding_tokens"] == 3
    assert fwd["captured"] == 2 and fwd["calls"] == 3


@pytest.mark.parametrize("value,message", [
    (float("nan"), "'median_ms' is nan: not a finite number"),
    (-1, "'median_ms' is -1: negative (no count, time, FLOPs or bytes is)"),
    (10**31, "'median_ms' is a 32-digit number: more than 1e30"),
    (10**30, None),  # the bound itself is allowed
    (0, None),
])
def test_row_numbers_are_finite_non_negative_and_bounded(value, message, tmp_path):
    row = {"size": 4, "calls": 1, "total_ms": 1.0, "median_ms": value, "p90_ms": 1.0,
           "flops": 1, "matmul_flops": 1, "runtime_flops": 0, "bytes_io": 1}
    data = {"schema": "fxflops.report/1", "process": {}, "graphs": [], "forward": [row]}
    if message is None:
        validate(data, "r.json")
        return
    with pytest.raises(ReportError) as e:
        validate(data, "r.json")
    assert str(e.value) == f"r.json: forward[0]: {message}"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))  # the same through a file (NaN as Python writes it)
    with pytest.raises(ReportError, match="forward\\[0\\]: 'median_ms'"):
        load_report(path)


def test_an_engines_estimate_is_sorted_into_fxflops_components_by_its_integration():
    """vLLM's perf.py keys are the integration's business: it sorts them into fxflops'
    components as it records a step (the report keeps the keys as they are), and gives the
    reasons a component differs; the report knows only the components, and has a plain
    reason where the engine gives none."""
    from fxflops.integrations.vllm.engine_stats import WHY, components
    from fxflops.recording.engine_stats import EngineStats
    from fxflops.report.engine import _estimate_per_step, compare

    breakdown = {"attn.qkv_proj": 10, "attn.attn_qk": 3, "attn.attn_av": 3,
                 "ffn.routed_ffn": 20, "ffn.shared_ffn": 5, "unembed.unembed": 7}
    assert components(breakdown) == {"rest": 15, "attention": 6, "moe": 20, "lm_head": 7}
    row = EngineStats().estimate(8)
    for _ in range(2):
        row.add(8, sum(breakdown.values()), 0, 0, breakdown, components(breakdown))
    row.add(8, 1, 0, 0, {"odd": 1}, {"odd": 1})  # a name that is no component: rest
    assert row.by_key == {**{k: 2 * v for k, v in breakdown.items()}, "odd": 1}
    assert row.by_component == {"rest": 31, "attention": 12, "moe": 40, "lm_head": 14}
    estimate = _estimate_per_step(row)
    assert estimate["attention"] == 4 and estimate["total"] == 97 / 3
    measured = {"attention": 2.0, "moe": 40 / 3, "rest": 31 / 3, "padding": 0.0,
                "lm_head": 0.0}
    said = {d["component"]: d["why"] for d in compare(measured, estimate, WHY)["differs"]}
    assert set(said) == {"attention", "lm_head"}
    assert said["attention"].startswith("vLLM counts attention as every query")
    plain = {d["component"]: d["why"] for d in compare(measured, estimate)["differs"]}
    assert set(plain) == {"attention", "lm_head"}
    assert not any("vLLM" in why for why in plain.values())
