"""What many processes did together: tensor-parallel shards, pipeline stages and
data-parallel replicas merged, each as what it is.

Every row carries its process's placement (``report.flat_rows``: ``dp``, ``pp``, ``tp`` and
their sizes; a report without them: its ``rank`` is a tensor-parallel shard, the one
parallelism older reports knew). Per run, per graph and size:

1. **shards** of one replica and stage (distinct ``tp``) each do a part of the same work:
   their FLOPs and bytes add up, calls add up over processes, and the time is the slowest
   shard's (the step waits for it). Against the peak of all the shards' devices.
2. **stages** of a pipeline run different parts of the model: each stage keeps its own row
   (``stage`` and ``place`` ``pp0``, ``pp1``, side by side), and per size the stages' whole forwards (vLLM's
   ``<forward>`` rows, else each graph) add up into the model's (graph ``<pipeline>``): FLOPs
   and bytes add, the time is the sum of the stages' (one batch goes through every stage in
   turn), against the peak of every device of the pipeline.
3. **replicas** (data parallelism, or separate processes of one rank) add their calls and
   totals; FLOPs and bytes per call stay (a calls-weighted mean, as is the time): a
   replica's rate, MFU per replica's devices.

Merged rows have ``rank`` ``"all"`` (what separates them from a process's own rows) and
say what they merged (``merged``: shards, stages, replicas) and how.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fxflops.report.figures import throughput

# per-call work: added over shards and stages, a calls-weighted mean over replicas
_WORK = ("flops", "matmul_flops", "runtime_flops", "bytes_io", "bytes_nodes",
         "recomputed_flops", "recomputed_matmul_flops", "estimated_flops")
# done over all calls: added over every process
_TOTALS = ("total_flops", "total_matmul_flops", "total_bytes", "total_runtime_flops",
           "total_runtime_bytes")
# calls timed, and calls whose time never came: added like the calls over shards and
# replicas (a pipeline's row counts batches through every stage: they are left out)
_COUNTS = ("chosen_calls", "timed_calls", "lost_samples")
# a row timed by CUDA events: its samples paced by the host, and shared (added likewise)
_DEVICE_COUNTS = ("host_bound_calls", "shared_calls")
_TIMES = ("median_ms", "p10_ms", "p90_ms")


def _coords(r: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """(replica, stage, shard) of a row's process; older reports: the rank is a shard."""
    tp = r.get("tp")
    if tp is None and r.get("pp") is None and r.get("dp") is None:
        tp = r.get("rank")
    return r.get("dp") or 0, r.get("pp") or 0, tp


def merge_rows(rows: Iterable[Mapping[str, Any]], peak: Mapping[str, Any] | None = None
               ) -> list[dict[str, Any]]:
    """The merged rows of the processes in ``rows`` (never across runs): per stage where
    there is a pipeline, and for the whole job. See the module's text."""
    peak = peak or {}
    out: list[dict[str, Any]] = []
    by_run: dict[Any, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        by_run[r.get("run")].append(r)
    for run_rows in by_run.values():
        out += _merge_run(run_rows, peak)
    return out


def _merge_run(rows: Sequence[Mapping[str, Any]], peak: Mapping[str, Any]
               ) -> list[dict[str, Any]]:
    # 1. shards, per (replica, stage, graph, size)
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        dp, pp, _ = _coords(r)
        groups[(dp, pp, r["graph"], r.get("warmup"), str(r["size"]))].append(r)
    stage_rows = [_shards(group, peak) for group in groups.values()]
    stages = sorted({_coords(r)[1] for r in rows})
    out: list[dict[str, Any]] = []
    if len(stages) > 1:
        # 2. the stages side by side (each over its replicas), and the pipeline they make
        per_stage: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
        for r in stage_rows:
            per_stage[(r["_pp"], r["graph"], r.get("warmup"), str(r["size"]))].append(r)
        for (pp, *_), group in per_stage.items():
            out.append({**_replicas(group, peak), "rank": "all", "place": f"pp{pp}",
                        "stage": f"pp{pp}"})
        out += _pipelines(stage_rows, len(stages), peak)
        return out
    # 3. replicas, per (graph, size)
    per_graph: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in stage_rows:
        per_graph[(r["graph"], r.get("warmup"), str(r["size"]))].append(r)
    return [{**_replicas(group, peak), "rank": "all", "place": "all"}
            for group in per_graph.values()]


def _shards(group: Sequence[Mapping[str, Any]], peak: Mapping[str, Any]) -> dict[str, Any]:
    """Tensor-parallel shards of one graph and size: their parts of the work add up."""
    first_of_shard: dict[Any, Mapping[str, Any]] = {}
    for r in group:
        first_of_shard.setdefault(_coords(r)[2], r)
    shards = list(first_of_shard.values())
    dp, pp, _ = _coords(group[0])
    m = {**group[0], "_dp": dp, "_pp": pp, "ranks": len(shards), "_devices": len(shards)}
    for f in ("calls", "total_ms", *_COUNTS):
        m[f] = sum(r.get(f) or 0 for r in group)
    _device_counts(m, group)
    for f in _WORK:
        m[f] = sum(r.get(f) or 0 for r in shards)
    for f in _TOTALS:
        m[f] = sum(r.get(f) or 0 for r in group)
    for f in _TIMES:  # the step waits for the slowest shard
        m[f] = max(r.get(f) or 0 for r in group)
    how = ("tensor-parallel shards: work added, the slowest shard's time"
           if any(r.get("tp") is not None for r in group) else
           "ranks of one job (torch.distributed: each its part of the batch, in step): work "
           "added, the slowest rank's time")
    m["merged"] = {"shards": len(shards), "stages": 1, "replicas": 1, "how": how}
    return _rates(m, peak)


def _device_counts(m: dict[str, Any], group: Sequence[Mapping[str, Any]]) -> None:
    """The merged row's device-timing counts and verdict (``time_bound``), where its rows
    were timed by CUDA events."""
    if not any("time_bound" in r for r in group):
        return
    for f in _DEVICE_COUNTS:
        m[f] = sum(r.get(f) or 0 for r in group)
    m["time_bound"] = "host" if 2 * m["host_bound_calls"] > (m.get("timed_calls") or 0) \
        else "device"


def _replicas(group: list[dict[str, Any]], peak: Mapping[str, Any]) -> dict[str, Any]:
    """Replicas of one graph and size: calls and totals add, per-call figures stay."""
    if len(group) == 1:
        return {k: v for k, v in group[0].items() if not k.startswith("_")}
    calls = sum(r.get("calls") or 0 for r in group) or 1

    def mean(field: str) -> float:
        return sum((r.get(field) or 0) * (r.get("calls") or 0) for r in group) / calls

    m = {**group[0]}
    m["calls"] = sum(r.get("calls") or 0 for r in group)
    for f in ("total_ms", *_TOTALS, *_COUNTS):
        m[f] = sum(r.get(f) or 0 for r in group)
    _device_counts(m, group)
    for f in (*_WORK, *_TIMES):
        m[f] = mean(f)
    m["ranks"] = sum(r.get("ranks") or 1 for r in group)
    m["merged"] = {**group[0]["merged"], "replicas": len(group),
                   "how": group[0]["merged"]["how"] + "; data-parallel replicas: calls and "
                   "totals added, per-call figures a calls-weighted mean"}
    return {k: v for k, v in _rates(m, peak).items() if not k.startswith("_")}


def _pipelines(stage_rows: list[dict[str, Any]], stages: int, peak: Mapping[str, Any]
               ) -> list[dict[str, Any]]:
    """Per replica and size, the stages' whole forwards (vLLM's ``<forward>`` rows; else
    every graph) added into the model's; then the replicas."""
    unit = [r for r in stage_rows if r["graph"] == "<forward>"] or stage_rows
    by_size: dict[tuple[Any, str], list[dict[str, Any]]] = defaultdict(list)
    for r in unit:
        by_size[(r["_dp"], str(r["size"]))].append(r)
    per_replica: list[dict[str, Any]] = []
    for group in by_size.values():
        present = {r["_pp"] for r in group}
        if any(r.get("warmup") for r in group):  # the pipeline's traffic only
            continue
        if len(present) < stages:  # not every stage ran this size: no whole model here
            continue
        m = {k: v for k, v in group[0].items()
             if k not in ("outside_share", "graphs_ms", *_COUNTS)}
        m.update(graph="<pipeline>", rank="all")
        per_stage_calls = [sum(r["calls"] for r in group if r["_pp"] == pp) for pp in present]
        m["calls"] = min(per_stage_calls)  # batches that went through every stage
        for f in (*_WORK, "total_ms", *_TOTALS, *_TIMES):
            m[f] = sum(r.get(f) or 0 for r in group)
        m["_devices"] = sum(r["_devices"] for r in group)
        m["ranks"] = sum(r.get("ranks") or 1 for r in group)
        m["merged"] = {"shards": group[0]["merged"]["shards"], "stages": len(present),
                       "replicas": 1, "how": "pipeline stages: work added, times added "
                       "(one batch through every stage in turn)"}
        per_replica.append(_rates(m, peak))
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in per_replica:
        by_key[str(r["size"])].append(r)
    return [{**_replicas(group, peak), "graph": "<pipeline>", "rank": "all", "place": "all"}
            for group in by_key.values()]


def _rates(m: dict[str, Any], peak: Mapping[str, Any]) -> dict[str, Any]:
    """Rates, MFU and the roofline against the peak of the devices the row ran on."""
    devices = m.get("_devices") or m.get("ranks") or 1
    m["gflops"] = (m.get("flops") or 0) / 1e9
    tflops, gbps = peak.get("tflops"), peak.get("gbps")
    m.update(throughput(m.get("flops") or 0, m.get("matmul_flops") or 0, m.get("bytes_io") or 0,
                        (m.get("median_ms") or 0) / 1e3, tflops * devices if tflops else None,
                        gbps * devices if gbps else None, m.get("recomputed_matmul_flops") or 0))
    return m


# a step's work: added over ranks
_STEP_WORK = ("flops", "matmul_flops", "bytes_io", "recomputed_flops", "recomputed_matmul_flops",
              "model_flops", "backward_flops")
_STEP_TIMES = ("forward_ms", "backward_ms", "other_ms", "step_ms")


def merge_steps(steps: Iterable[dict[str, Any]], peak: Mapping[str, Any] | None = None
                ) -> list[dict[str, Any]]:
    """The job's training step per run and size, from every rank's (``steps.training_steps``).

    Data-parallel ranks (DDP, FSDP) each run the step on their part of the global batch,
    together: the job's step does the work of all of them (FLOPs and bytes added) and ends
    with the slowest rank (times: the maximum), against the peak of all their devices.
    """
    peak = peak or {}
    groups: dict[tuple[Any, str], list[dict[str, Any]]] = defaultdict(list)
    for s in steps:
        if s.get("rank") != "all":
            groups[(s.get("run"), str(s["size"]))].append(s)
    out = []
    for group in groups.values():
        ranks = {s.get("rank") for s in group}
        m = {**group[0], "rank": "all", "pid": None, "ranks": len(ranks),
             "steps": min(s["steps"] for s in group)}
        for f in _STEP_WORK:
            m[f] = sum(s.get(f) or 0 for s in group)
        for f in _STEP_TIMES:
            m[f] = max(s.get(f) or 0 for s in group)
        m["other_graphs"] = sorted({g for s in group for g in s.get("other_graphs", [])})
        m["merged"] = {"ranks": len(ranks), "how": "ranks of one step: work added, the "
                       "slowest rank's times"}
        seconds = m["step_ms"] / 1e3
        tflops, gbps = peak.get("tflops"), peak.get("gbps")
        m.update(throughput(m["flops"], m["matmul_flops"], m["bytes_io"], seconds,
                            tflops * len(ranks) if tflops else None,
                            gbps * len(ranks) if gbps else None,
                            m["recomputed_matmul_flops"]))
        m["model_tflops"] = m["model_flops"] / seconds / 1e12 if seconds > 0 else None
        out.append(m)
    return out


def merged_anything(row: dict[str, Any]) -> bool:
    """Whether a merged row merged more than one process's row (a stage of one process is
    that process's row again)."""
    m = row.get("merged") or {}
    return row.get("graph") == "<pipeline>" or \
        (m.get("shards") or 1) * (m.get("stages") or 1) * (m.get("replicas") or 1) > 1


def describe(rows: Iterable[dict[str, Any]]) -> list[str]:
    """What merged rows merged, and how: one line per kind of merge (none for rows that
    merged nothing), as ``report``, ``compare`` and ``plot`` print it."""
    seen: dict[str, dict[str, Any]] = {}
    for r in rows:
        m = r.get("merged")
        if r.get("rank") == "all" and m and merged_anything(r):
            seen.setdefault(m["how"], m)
    return [f"merged ({m['shards']} shard(s) x {m['stages']} stage(s) x {m['replicas']} "
            f"replica(s)): {how}" for how, m in seen.items()]
