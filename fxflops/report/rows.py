"""Reports flattened to one row per (graph, size, process), tagged with the run and the
process's place: what merges, tables and plots read.
"""

from __future__ import annotations

from typing import Any, cast

from fxflops.placement import place_of
from fxflops.report.files import run_id
from fxflops.report.schema import FlatRow

# the rows of whole forwards (vLLM): the target's, and a speculative decoder's drafter
# passes; the other rows are graphs'
WHOLE_FORWARDS = ("<forward>", "<draft>")


def flat_rows(reports: list[dict[str, Any]], warmup: bool = False) -> list[FlatRow]:
    """Every (graph, size) row of every report, tagged with its run, process and placement;
    with ``warmup``, the warm-up rows too (each with its ``warmup`` phase).

    The placement (``process.ranks``: ``dp``, ``pp``, ``tp``, their sizes, the node) is on
    every row, with ``place`` its short name (``pp1 tp0``), so that ``fxflops.report.merge`` can
    tell shards from stages from replicas. Graphs that share a name in one report are kept
    apart: the second is ``name#2``. Rows of a training step's graphs carry their ``phase``,
    ``source`` and ``frame``; a drafter's graphs and passes (``<draft>``) their
    ``workload: draft``.
    """
    rows: list[dict[str, Any]] = []
    for rep in reports:
        proc = rep["process"]
        ranks = {k: v for k, v in (proc.get("ranks") or {}).items() if k != "rank"}
        tags = {"run": run_id(rep), "rank": proc.get("rank"), "pid": proc.get("pid"), **ranks,
                "place": place_of(proc)}
        if rep.get("collectives"):  # FSDP2's, outside the graphs (fxflops.report.steps per step)
            tags["collective_bytes_total"] = sum(v["bytes"] for v in rep["collectives"].values())
        seen: dict[str, int] = {}
        for g in rep["graphs"]:
            seen[g["name"]] = seen.get(g["name"], 0) + 1
            name = g["name"] if seen[g["name"]] == 1 else f"{g['name']}#{seen[g['name']]}"
            meta = g.get("meta") or {}
            # a training graph's phase, the Dynamo graph it came from, the Python frame
            # (fxflops.instrument.autograd, fxflops.report.steps)
            origin = {k: meta[k] for k in ("phase", "source", "frame", "piece", "workload")
                      if k in meta}
            for r in g["rows"] + (g.get("warmup", []) if warmup else []):
                rows.append({**tags, "graph": name, "fingerprint": g.get("fingerprint"),
                             **origin, **r})
        for r in rep["forward"] + (rep.get("forward_warmup", []) if warmup else []):
            rows.append({**tags, "graph": "<forward>", **r})
        for r in rep.get("draft_forward", []):  # a speculative decoder's drafter passes
            rows.append({**tags, "graph": "<draft>", "workload": "draft", **r})
    # (each row is a report's, read from JSON, tagged: validated as such by ``load_report``)
    return cast("list[FlatRow]", rows)


