"""Where this process sits among many: its ranks and the world sizes of data, pipeline and
tensor parallelism, and its node.

Set by an integration that knows them (vLLM: its process groups and parallel config), else
read from ``torch.distributed`` once initialised, else from torchrun's environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``GROUP_RANK``), else from ``FXFLOPS_RANK``.
A report keeps them in ``process.ranks``; the merge of many reports reads them there
(``fxflops.report.merge``): tensor-parallel shards add up their work, pipeline stages are the
model's parts, data-parallel replicas add up their calls.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from fxflops import config

# the fields of a placement, in the order they are shown
FIELDS = ("rank", "world", "dp", "dp_size", "pp", "pp_size", "tp", "tp_size", "node", "nodes")


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def from_torch_distributed() -> dict[str, int]:
    """Global rank and world size (a torch.distributed job: each rank one data-parallel
    replica unless an integration says otherwise), and torchrun's node."""
    out: dict[str, int] = {}
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            out["rank"], out["world"] = dist.get_rank(), dist.get_world_size()
    except Exception:  # a backend in a bad state: the environment is still there
        pass
    for key, var in (("rank", "RANK"), ("world", "WORLD_SIZE"), ("node", "GROUP_RANK")):
        value = _env_int(var)
        if value is not None:
            out.setdefault(key, value)
    local_world = _env_int("LOCAL_WORLD_SIZE")
    if local_world and "world" in out and out["world"] % local_world == 0:
        out.setdefault("nodes", out["world"] // local_world)
    return out


def placement(info: dict[str, Any]) -> dict[str, int]:
    """This process's placement: what an integration noted in ``info["ranks"]`` over what
    torch.distributed or torchrun say, and ``FXFLOPS_RANK`` for the rank where nothing
    else does."""
    out = from_torch_distributed()
    out.update({k: v for k, v in (info.get("ranks") or {}).items() if v is not None})
    rank = config.RANK.get()
    if rank is not None:
        out["rank"] = rank
    return {k: out[k] for k in FIELDS if k in out}


def label(ranks: dict[str, Any]) -> str:
    """A short name of a placement: ``dp1 pp0 tp1`` (the parallelisms that are there)."""
    parts = [f"{k}{ranks[k]}" for k in ("dp", "pp", "tp")
             if k in ranks and (ranks.get(f"{k}_size") or 1) > 1]
    if not parts and ranks.get("rank") is not None:
        parts = [f"rank{ranks['rank']}"]
    return " ".join(parts)


def place_of(process: dict[str, Any]) -> str:
    """A report's process by its place (``pp1 tp0``, ``rank1``), else its pid."""
    ranks = {**(process.get("ranks") or {}), "rank": process.get("rank")}
    return label(ranks) or f"pid {process.get('pid')}"


def shared_run_id(candidate: str) -> str | None:
    """One run id for every process of a torch.distributed job: the first to ask puts
    ``candidate`` in the job's store (the one ``init_process_group`` made: no collective,
    one round trip), every other reads it. Before ``init_process_group``, under torchrun:
    its master address, port and rendezvous id. None outside a job."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            store = dist.distributed_c10d._get_default_store()
            value = store.compare_set("fxflops/run_id", "", candidate)
            return (value.decode() if isinstance(value, bytes) else str(value)) or candidate
    except Exception:  # a store that cannot do it: the environment's id
        pass
    if "TORCHELASTIC_RUN_ID" in os.environ and "MASTER_PORT" in os.environ:
        return "torchrun-" + "-".join(os.environ.get(k, "") for k in (
            "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"))
    return None


def run_id() -> str:
    """This run's id: ``FXFLOPS_RUN_ID``, or a torch.distributed job's (every rank's the
    same: ``placement.shared_run_id``), or a new one; then exported so that the processes
    this one starts (vLLM's engine and workers) report under the same run."""
    current = config.RUN_ID.get()
    if current is None:
        import socket
        import time

        current = f"{socket.gethostname()}-{os.getpid()}-{int(time.time())}"
        current = shared_run_id(current) or current
        os.environ[config.RUN_ID.name] = current
    return current


