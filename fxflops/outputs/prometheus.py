"""Prometheus counters of the recorder's rows: the rows' totals, never touched per call.

Two ways out, one set of samples (:func:`samples`):

- **files**, at each flush, in ``prometheus_client``'s multi-process format: into
  ``PROMETHEUS_MULTIPROC_DIR`` when it is set (vLLM sets it for several API servers; its
  ``/metrics`` then collects every process's files), else into ``FXFLOPS_PROMETHEUS_DIR``,
  which the vLLM plugin makes in the API server, collects there, and hands down to the
  engine and worker processes (``fxflops.integrations.vllm.plugin``), else with
  ``FXFLOPS_PROMETHEUS_PORT`` into the node's folder for that port, which one process of
  the node serves on that port (:func:`serve_node`: nodes without vLLM's API server, a
  multi-node training job);
- **a collector**, read at scrape time: ``fxflops.recorder().register_prometheus(registry)``
  for any process that serves its own registry.

The files are written by ``PrometheusFiles``, a sink of the recorder, at each flush.

Names follow Prometheus' conventions: counters end in ``_total``, units are base units
(FLOPs, bytes, seconds). Labels: ``graph``, ``size``, ``rank`` (the global rank), and
where the process has them ``dp``, ``pp``, ``tp`` and ``node``. The label sets stay
bounded: per graph, the first ``FXFLOPS_PROMETHEUS_SIZES`` sizes seen keep a ``size`` label
of their own (so a size's counter never changes label); calls at any other size, and the
graph's overflow row, add up under ``size="other"``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from fxflops import config
from fxflops.peaks.devices import process_peak
from fxflops.recording.recorder import Sink, Snapshot
from fxflops.report.build import forward_figures_of
from fxflops.report.engine import COMPONENTS, estimate_comparison
from fxflops.report.figures import sorted_rows
from fxflops.util import stop_signals_blocked, warn_once, write_or_warn

if TYPE_CHECKING:
    from fxflops.recording.recorder import Recorder
    from fxflops.recording.size_stats import SizeStats

OTHER = "other"

# (name without _total, help); the same for compiled graphs and whole forwards
_ROW_COUNTERS = (
    ("calls", "calls"),
    ("flops", "FLOPs done (matmul and vector; attention counted from real context lengths)"),
    ("matmul_flops", "matmul-class FLOPs done (what MFU is measured on)"),
    ("bytes", "bytes moved (inputs, outputs and weights; the KV cache attention reads)"),
    ("seconds", "device seconds (CUDA events on a GPU, the CPU clock on CPU)"),
)
_FORWARD_COUNTERS = (
    ("tokens", "tokens the forwards ran at (padded up to a CUDA-graph size)"),
    ("scheduled_tokens", "tokens the scheduler gave the forwards (the rest is padding)"),
)
_GAUGES = (
    ("fxflops_peak_flops_per_second", "the device's peak FLOP/s (MFU = rate(matmul FLOPs) / "
     "this)", "tflops", 1e12),
    ("fxflops_peak_bytes_per_second", "the device's peak memory bandwidth, bytes/s", "gbps",
     1e9),
)


class Sample(NamedTuple):
    kind: str  # "counter" or "gauge"
    family: str  # the metric's name (a counter's without "_total")
    help: str
    labels: tuple[tuple[str, str], ...]
    value: float


def samples(rec: Recorder) -> list[Sample]:
    """Every counter and gauge of this process, from its rows as they are now (settled by
    the caller: a flush, a scrape; ``Recorder.settle``)."""
    from fxflops.placement import placement
    from fxflops.report.figures import forward_cost, forward_costs

    # the process's place: its global rank, and its data, pipeline and tensor-parallel
    # ranks and node where it has them (many processes' series stay apart)
    ranks = placement(rec.info)
    where: tuple[tuple[str, str], ...] = (("rank", str(ranks.get("rank", 0))),) + tuple(
        (k, str(ranks[k])) for k in ("dp", "pp", "tp", "node") if k in ranks)
    limit = config.PROMETHEUS_SIZES.get()
    out: list[Sample] = []
    for g in rec.graphs_snapshot():
        estimated = g.cost.estimated
        for size, rows in _bounded(list(g.rows.values()), g.overflow, limit):
            labels: tuple[tuple[str, str], ...] = (("graph", g.name), ("size", size), *where)
            out += _row_samples("fxflops_graph", "compiled graph", labels, rows)
            if estimated:
                value = sum((r.cost.estimated_flops if r.cost else 0) * r.count for r in rows)
                out.append(Sample("counter", "fxflops_graph_estimated_flops",
                                  "fxflops: matmul FLOPs counted from layers' sizes (an op no "
                                  "formula counts right; see fxflops_graph_estimated_layers)",
                                  labels, value))
        ops: dict[str, int] = {}
        for e in estimated:
            for op in e.ops:
                ops[op] = ops.get(op, 0) + 1
        for op, count in sorted(ops.items()):
            out.append(Sample("gauge", "fxflops_graph_estimated_layers",
                              "fxflops: layers counted from their sizes because no formula "
                              "counts this op (the report names them)",
                              (("graph", g.name), ("op", op), *where), count))
    costs = forward_costs(rec)
    for size, rows in _bounded(rec.forwards_snapshot(), None, limit):
        labels = (("size", size), *where)
        out += _row_samples("fxflops_forward", "whole forward (vLLM)", labels, rows,
                            [forward_cost(costs, r) for r in rows])
        per_row = [(int(r.key[0]) if r.key else 0, *(r.forward.scheduled_tokens() if r.forward
                                                    else (0, 0))) for r in rows]
        padded = sum(size * forwards for size, forwards, _ in per_row)
        scheduled = sum(tokens for _, _, tokens in per_row)
        for (name, text), value in zip(_FORWARD_COUNTERS, (padded, scheduled)):
            out.append(Sample("counter", f"fxflops_forward_{name}", f"fxflops: {text}",
                              labels, value))
    drafts = rec.forwards_snapshot("draft")
    if drafts:  # a speculative decoder's drafter passes, apart from the target's forwards
        draft_costs = forward_costs(rec, "draft")
        for size, rows in _bounded(drafts, None, limit):
            out += _row_samples("fxflops_draft_forward", "drafter passes (vLLM speculative "
                                "decoding)", (("size", size), *where), rows,
                                [forward_cost(draft_costs, r) for r in rows])
    try:  # (vLLM's figures beside ours: never at the cost of the rest of the samples)
        out += _engine_samples(rec, where)
    except Exception as e:
        warn_once("prometheus-engine", "fxflops: vLLM's estimate left out of the metrics "
                  "(%s: %s)", type(e).__name__, e)
    for entry in list(rec.uninstrumented):
        out.append(Sample("counter", "fxflops_uninstrumented_calls",
                          "fxflops: calls of a graph fxflops could not instrument (the report "
                          "says why)", (("graph", entry.name), *where),
                          entry.calls))
    peak: Mapping[str, Any] = process_peak(rec.info)
    for name, text, field, unit in _GAUGES:
        figure = peak.get(field)
        if figure:
            out.append(Sample("gauge", name, f"fxflops: {text}", where, float(figure) * unit))
    return out


def _engine_samples(rec: Recorder, where: tuple[tuple[str, str], ...]) -> list[Sample]:
    """vLLM's own estimate of the steps (``--enable-mfu-metrics``), by component, and the
    measured FLOPs over it (LM head aside); speculative decoding's drafts."""
    out: list[Sample] = []
    estimates = rec.engine.estimates_snapshot()
    if estimates:
        parts = dict.fromkeys(COMPONENTS, 0)
        for r in estimates:
            for component, value in r.by_component.items():
                parts[component] += value
        for component, value in parts.items():
            out.append(Sample("counter", "fxflops_vllm_estimated_flops",
                              "fxflops: vLLM's own estimate of the steps' FLOPs per GPU "
                              "(--enable-mfu-metrics), by component", (("component", component),
                                                                       *where), value))
        out.append(Sample("counter", "fxflops_vllm_estimated_steps",
                          "fxflops: steps vLLM estimated", where,
                          sum(r.steps for r in estimates)))
        figures = forward_figures_of(rec, process_peak(rec.info))
        compared = estimate_comparison(rec, [figures(r) for r in
                                             sorted_rows(rec.forwards_snapshot())])
        if compared and compared[-1].get("ratio") is not None:
            out.append(Sample("gauge", "fxflops_measured_over_vllm_estimate",
                              "fxflops: measured graph FLOPs over vLLM's own estimate of the "
                              "same steps, LM head aside (1: they agree)", where,
                              float(compared[-1]["ratio"])))
    spec = rec.engine.spec_decode
    if spec.drafts:
        for name, text, value in (
                ("drafts", "requests' steps that carried drafts", spec.drafts),
                ("proposed_tokens", "draft tokens proposed", spec.proposed),
                ("accepted_tokens", "draft tokens accepted", spec.accepted)):
            out.append(Sample("counter", f"fxflops_spec_decode_{name}",
                              f"fxflops: speculative decoding: {text}", where, value))
    return out


def _bounded(rows: Any, overflow: SizeStats | None, limit: int
             ) -> Iterator[tuple[str, list[SizeStats]]]:
    """(size label, rows) with at most ``limit`` labels of their own and ``"other"``."""
    rest: list[SizeStats] = [overflow] if overflow is not None and overflow.count else []
    for i, row in enumerate(rows):  # in the order sizes were first seen
        if i < limit:
            if row.count:
                yield str(row.size), [row]
        else:
            rest.append(row)
    if rest:
        yield OTHER, rest


def _row_samples(prefix: str, what: str, labels: tuple[tuple[str, str], ...],
                 rows: list[SizeStats], costs: list[Any] | None = None) -> list[Sample]:
    flops = matmul = bytes_ = calls = 0
    ns = 0
    for i, r in enumerate(rows):
        f, m, b, n = r.totals(costs[i] if costs is not None else None)
        flops, matmul, bytes_, calls, ns = flops + f, matmul + m, bytes_ + b, calls + n, \
            ns + r.total_ns
    values = (calls, flops, matmul, bytes_, ns / 1e9)
    return [Sample("counter", f"{prefix}_{name}", f"fxflops: {what}: {text}", labels, value)
            for (name, text), value in zip(_ROW_COUNTERS, values)]


# --- at flush time: prometheus_client's multi-process files ----------------------------


def files_dir() -> str | None:
    """Where this process writes its counters' files. With ``FXFLOPS_PROMETHEUS_PORT``: the
    folder the node's exporter serves (``FXFLOPS_PROMETHEUS_DIR``, else the node's folder
    for that port, which every process of the node finds without being told); the
    counters are then on that port, not in vLLM's ``/metrics``. Without: vLLM's
    ``PROMETHEUS_MULTIPROC_DIR`` (its ``/metrics`` collects it), else
    ``FXFLOPS_PROMETHEUS_DIR``; None: none of them is set."""
    port = config.PROMETHEUS_PORT.get()
    if port is not None:
        return config.PROMETHEUS_DIR.get() or node_dir(port)
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or config.PROMETHEUS_DIR.get()


def metrics_dir() -> str | None:
    """Where the counters' files go (None: not asked for, or nowhere to go)."""
    if not config.PROMETHEUS.get():
        return None
    where = files_dir()
    if where is None:
        warn_once("prometheus-nowhere", "fxflops: FXFLOPS_PROMETHEUS=1 but nowhere to write "
                  "the counters: set FXFLOPS_PROMETHEUS_PORT (this node's exporter), "
                  "PROMETHEUS_MULTIPROC_DIR or FXFLOPS_PROMETHEUS_DIR, or "
                  "serve them with fxflops.recorder().register_prometheus()")
    return where


class PrometheusFiles(Sink):
    """With ``FXFLOPS_PROMETHEUS``: the counters' files at each flush (``write_files``),
    and this node's exporter where ``FXFLOPS_PROMETHEUS_PORT`` asks for one and no process
    of the node serves it yet (one bind attempt per flush, never on the hot path)."""

    def writes(self) -> bool:
        return metrics_dir() is not None

    def record(self, snapshot: Snapshot) -> None:
        where = metrics_dir()
        if where and not snapshot.beside:

            def write(directory: str) -> None:
                write_files(snapshot.recorder, directory)
                serve_node(directory)

            write_or_warn(where, write)


def node_dir(port: int) -> str:
    """The folder the processes of this node write to for the exporter on ``port``."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"fxflops-prometheus-{port}")


# --- one exporter per node: FXFLOPS_PROMETHEUS_PORT ------------------------------------

# this process's exporter, by port (at most one: the node's); set where it bound the port
_serving: dict[int, Any] = {}
_FILE_PREFIXES = ("counter_fxflops-", "gauge_max_fxflops-")


class NodeCollector:
    """fxflops' counters files in a folder, merged as prometheus_client's multi-process
    collector merges them (vLLM's own files there are vLLM's ``/metrics``' business)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def collect(self) -> Iterator[Any]:
        from prometheus_client.multiprocess import MultiProcessCollector

        return iter(MultiProcessCollector.merge(_fxflops_files(self.directory), accumulate=True))


def _fxflops_files(directory: str) -> list[str]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [os.path.join(directory, n) for n in sorted(names)
            if n.startswith(_FILE_PREFIXES) and n.endswith(".db")]


def serve_node(directory: str | None = None) -> bool:
    """With ``FXFLOPS_PROMETHEUS_PORT``: serve the counters every fxflops process of this
    node writes (``files_dir()``) on that port, from this process if no other does yet.

    The process that holds the folder's exporter lock (``exporter-PORT.lock``) serves the
    node; the others only write their files and try again at their next flush (so that
    another takes over if it ends: the lock goes with its process). A port that the lock's
    holder cannot bind is some other program's: warned about once (the counters are still
    written). Files of processes no longer running when the exporter starts are an earlier
    run's: removed. Returns whether this process serves the node's counters."""
    port = config.PROMETHEUS_PORT.get()
    if port is None:
        return False
    if port in _serving:
        return True
    directory = directory or files_dir() or node_dir(port)
    import errno

    from prometheus_client import CollectorRegistry, start_http_server

    os.makedirs(directory, exist_ok=True)
    lock = _exporter_lock(directory, port)
    if lock is None:  # another live process of this node serves it
        return False
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(directory))
    try:
        with stop_signals_blocked():  # its serving thread: not the one a signal lands on
            server, _ = start_http_server(port, registry=registry)
    except OSError as e:
        if lock >= 0:
            os.close(lock)  # another process of the node may bind it later
        if e.errno != errno.EADDRINUSE:
            warn_once(f"node-exporter:{port}", "fxflops: cannot serve the counters on port "
                      "%s (%s); they are still written to %s", port, e, directory)
        elif lock >= 0:  # with the lock held, no exporter of this node has the port
            warn_once(f"node-exporter:{port}", "fxflops: port %s is taken by a program that "
                      "is not this node's fxflops exporter: the counters are written to %s "
                      "but not served (set FXFLOPS_PROMETHEUS_PORT to a free port)", port,
                      directory)
        return False
    _forget_in_children()
    _serving[port] = server
    if lock >= 0:
        _locks[port] = lock
    _forget_dead(directory)
    return True


# The node's exporter is whoever holds the folder's lock for the port, not whoever holds
# the port: anything may hold a port (a port-0 bind of gloo, ZMQ or a store draws from the
# ephemeral range a free port may have been picked from), and a client would then talk to
# that program. An advisory ``flock``: released when its process ends, however it ends.
_locks: dict[int, int] = {}  # port -> the held lock's descriptor (while serving)


def _exporter_lock(directory: str, port: int) -> int | None:
    """The folder's exporter lock for ``port``, taken: its descriptor; None where another
    process holds it; -1 where no lock can be had here (no ``fcntl``, a folder that cannot
    hold the file): the bind alone decides, and a taken port is not warned about."""
    try:
        import fcntl
    except ImportError:
        return -1
    try:
        fd = os.open(os.path.join(directory, f"exporter-{port}.lock"), os.O_RDWR | os.O_CREAT,
                     0o666)
    except OSError:
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:  # a file system without flock
        os.close(fd)
        return -1
    return fd


def stop_serving(port: int) -> None:
    """Stop this process's exporter on ``port`` and let another process of the node take
    it (its lock released)."""
    server = _serving.pop(port, None)
    if server is not None:
        server.shutdown()
        server.server_close()
    lock = _locks.pop(port, None)
    if lock is not None:
        os.close(lock)


def _forget_dead(directory: str) -> None:
    for path in _fxflops_files(directory):
        pid = os.path.basename(path).rsplit("-", 1)[-1].removesuffix(".db")
        if pid.isdigit() and not _alive(int(pid)):
            try:
                os.remove(path)
            except OSError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def _forget_server_in_child() -> None:
    """(In a forked child.) The parent serves the port; the child must not hold its
    listening socket open past the parent's end (scrapes would hang on it)."""
    for server in _serving.values():
        try:
            server.socket.close()
        except OSError:
            pass
    _serving.clear()
    for lock in _locks.values():  # the parent's lock stays the parent's (and ends with it)
        try:
            os.close(lock)
        except OSError:
            pass
    _locks.clear()
    _open.clear()


_FORK_HOOK: list[bool] = []


def _forget_in_children() -> None:
    """At the first server or file this process opens (never at import)."""
    if not _FORK_HOOK:
        _FORK_HOOK.append(True)
        os.register_at_fork(after_in_child=_forget_server_in_child)


_open: dict[tuple[str, int, str], Any] = {}  # (folder, pid, kind) -> MmapedDict


def write_files(rec: Recorder, directory: str) -> int:
    """Write every sample into this process's files in ``directory`` (values, not
    increments: a counter file holds this process's totals). Returns the samples written."""
    from prometheus_client.mmap_dict import MmapedDict, mmap_key

    _forget_in_children()
    pid = os.getpid()
    os.makedirs(directory, exist_ok=True)  # a node's folder: whichever process comes first
    written = 0
    for s in samples(rec):
        # the type is the file name's first part; a gauge's aggregation its second (max:
        # one value per rank); "fxflops-<pid>" keeps fxflops' files apart from vLLM's own
        kind = "counter" if s.kind == "counter" else "gauge_max"
        slot = (directory, pid, kind)
        mmap = _open.get(slot)
        if mmap is None:
            mmap = _open[slot] = MmapedDict(os.path.join(directory, f"{kind}_fxflops-{pid}.db"))
        sample_name = f"{s.family}_total" if s.kind == "counter" else s.family
        names, values = [k for k, _ in s.labels], [v for _, v in s.labels]
        mmap.write_value(mmap_key(s.family, sample_name, names, values, s.help), s.value, 0.0)
        written += 1
    return written


# --- at scrape time: a collector of a live recorder ------------------------------------


class RecorderCollector:
    """A ``prometheus_client`` collector of one recorder's samples, read at each scrape."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        self.rec.settle()  # (CUDA-graph replays counted: a scrape sees every one so far)
        families: dict[str, Any] = {}
        for s in samples(self.rec):
            family = families.get(s.family)
            if family is None:
                make = CounterMetricFamily if s.kind == "counter" else GaugeMetricFamily
                family = families[s.family] = make(s.family, s.help,
                                                   labels=[k for k, _ in s.labels])
            family.add_metric([v for _, v in s.labels], s.value)
        yield from families.values()
