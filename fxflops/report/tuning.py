"""Which sizes to compile and capture, from one run: its traffic, its times, a budget.

What a run tells, per size it served (vLLM's whole forwards; else the graphs' rows summed
per size): the calls, the median, how the size ran — **captured** (CUDA-graph replays:
vLLM pads a step up to the next captured size), **specialised** (a static graph: vLLM's
``compile_sizes``) or **general** (the dynamic graph) — and the token counts the scheduler
gave the forwards behind it (the padding).

The model: a step of ``n`` scheduled tokens takes, on a captured or specialised graph of
size ``s``, ``T_fast(s)``, and on the general graph ``T_gen(n)``, each interpolated
(piecewise linearly in the size) from the medians measured at the sizes that ran that way
(below the smallest one: its time; above the largest: in proportion to the size). Then:

- **capture sizes** (the run has captured steps): choose at most ``budget`` sizes S
  minimising the expected time per step ``sum_n H(n) T(n, S) / sum_n H(n)``, where a step
  of ``n`` tokens pads to the smallest size of S at least ``n`` and runs eagerly past the
  largest (or, without eager data, S must reach the largest ``n``). Optimal sizes are among
  the scheduled counts; a dynamic programme over them finds the optimum exactly.
- **compile sizes** (the run has specialised and general sizes, no capture): a size is
  matched exactly (no padding), so each recommended size saves ``H(n) (T_gen(n) -
  T_fast(n))``: the ``budget`` largest positive savings.
- **too thin to decide** (every size ran on the general graph): the run cannot tell what a
  specialised or captured graph would save. The sizes carrying the most time
  (``H(n) T_gen(n)``) are proposed as ``compile_sizes`` to try, and the way to confirm them
  is a second run with them and ``fxflops tune BASE SIZED``.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from collections import defaultdict
from typing import Any

from fxflops.report.schema import ReportError

CAPTURED, SPECIALISED, GENERAL = "captured", "specialised", "general"
THIN_CALLS = 20  # fewer forwards than this: every estimate is said to rest on little


@dataclasses.dataclass
class Served:
    """One size a run served: how often, how fast, how, and the tokens behind it."""

    size: int
    calls: int
    median_ms: float
    kind: str
    scheduled: dict[int, int]

    @property
    def padding_share(self) -> float:
        """The share of the tokens this size ran that were padding."""
        forwards = sum(self.scheduled.values())
        return 1 - sum(n * c for n, c in self.scheduled.items()) / (self.size * forwards)


@dataclasses.dataclass
class Recommendation:
    mode: str  # "capture", "compile" or "thin"
    sizes: list[int]
    gains_ms: dict[int, float]  # per recommended size: time saved per step (None: unknown)
    now_ms: float  # expected time per step as the run ran
    expected_ms: float | None  # with the recommendation (None: unknown)
    cc: dict[str, list[int]]
    notes: list[str]


class Curve:
    """Time against size from measured (size, median) points, piecewise linear."""

    def __init__(self, points: dict[int, float]) -> None:
        self.xs = sorted(points)
        self.ts = [points[x] for x in self.xs]

    def __bool__(self) -> bool:
        return bool(self.xs)

    def covers(self, x: int) -> bool:
        return bool(self.xs) and self.xs[0] <= x <= self.xs[-1]

    def at(self, x: int) -> float:
        xs, ts = self.xs, self.ts
        if x <= xs[0]:
            return ts[0]
        if x >= xs[-1]:
            return ts[-1] * x / xs[-1]
        i = bisect_left(xs, x)
        if xs[i] == x:
            return ts[i]
        x0, x1, t0, t1 = xs[i - 1], xs[i], ts[i - 1], ts[i]
        return t0 + (t1 - t0) * (x - x0) / (x1 - x0)


def served_sizes(reports: list[dict[str, Any]]) -> list[Served]:
    """The sizes one run (or one pipeline stage of it) served. Tensor-parallel shards of
    one replica ran the same steps: the slowest shard's median. Data-parallel replicas
    each served their own traffic: calls and scheduled tokens added, the median a
    calls-weighted mean (as ``fxflops.report.merge`` merges replicas). A size of 0 (an
    empty batch) is left out: it has no tokens to pad or to time per token."""
    replicas: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for rep in reports:
        replicas[int((rep["process"].get("ranks") or {}).get("dp") or 0)].append(rep)
    by_size: dict[int, list[Served]] = defaultdict(list)
    for reps in replicas.values():
        for s in _replica_served(reps):
            by_size[s.size].append(s)
    out = []
    for size, group in sorted(by_size.items()):
        if size <= 0:
            continue
        calls = sum(s.calls for s in group)
        scheduled = traffic(group)  # the replicas' scheduled tokens, added
        kinds = {s.kind for s in group}
        median = sum(s.median_ms * s.calls for s in group) / calls if calls else \
            max(s.median_ms for s in group)
        out.append(Served(size, calls, median, group[0].kind if len(kinds) == 1 else GENERAL,
                          scheduled))
    return out


def layout(reports: list[dict[str, Any]]) -> tuple[int, int, int]:
    """(shards, stages, replicas) of one run's reports, from their placement (a report
    without one: its rank is a shard)."""
    shards, stages, replicas = set(), set(), set()
    for rep in reports:
        ranks = rep["process"].get("ranks") or {}
        placed = any(k in ranks for k in ("tp", "pp", "dp"))
        shards.add(ranks.get("tp") if placed else rep["process"].get("rank"))
        stages.add(ranks.get("pp") or 0)
        replicas.add(ranks.get("dp") or 0)
    return len(shards), len(stages), len(replicas)


def _replica_served(reports: list[dict[str, Any]]) -> list[Served]:
    """The sizes one replica served (its shards ran the same steps: the slowest's median)."""
    specialised = {r["size"] for rep in reports for g in rep["graphs"] if not g.get("symbols")
                   for r in g["rows"] if isinstance(r["size"], int)}
    specialised |= {g.get("meta", {}).get("compile_size") for rep in reports
                    for g in rep["graphs"]} - {None}
    by_size: dict[int, Served] = {}
    forwards = [r for rep in reports for r in rep["forward"]
                if isinstance(r["size"], int) and r["calls"]]
    if forwards:
        for r in forwards:
            kind = CAPTURED if 2 * r.get("captured", 0) > r["calls"] else (
                SPECIALISED if r["size"] in specialised else GENERAL)
            scheduled = {int(n): c for n, c in (r.get("scheduled") or {}).items()} or \
                {r["size"]: r["calls"]}
            _merge(by_size, Served(r["size"], r["calls"], r["median_ms"], kind, scheduled))
    else:  # plain torch.compile: the graphs' medians added per size
        for rep in reports:
            summed: dict[int, list[Any]] = {}
            for g in rep["graphs"]:
                for r in g["rows"]:
                    if isinstance(r["size"], int) and r["calls"]:
                        acc = summed.setdefault(r["size"], [0.0, 0, False])
                        acc[0] += r["median_ms"]
                        acc[1] = max(acc[1], r["calls"])
                        acc[2] = acc[2] or not g.get("symbols")
            for size, (ms, calls, static) in summed.items():
                _merge(by_size, Served(size, calls, ms, SPECIALISED if static else GENERAL,
                                       {size: calls}))
    return sorted(by_size.values(), key=lambda s: s.size)


def by_stage(reports: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """One run's reports per pipeline stage (``process.ranks.pp``; one stage without)."""
    stages: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for rep in reports:
        stages[int((rep["process"].get("ranks") or {}).get("pp") or 0)].append(rep)
    return dict(sorted(stages.items()))


def pipeline_served(stages: dict[int, list[Served]]) -> list[Served]:
    """A pipeline's sizes: a batch goes through every stage in turn, so a size's time is the
    sum of the stages' medians; its calls and tokens, the first stage's (every stage ran
    the same batches). Sizes some stage did not serve are left out."""
    per_stage = [{s.size: s for s in served} for served in stages.values()]
    common = set.intersection(*(set(m) for m in per_stage)) if per_stage else set()
    out = []
    for size in sorted(common):
        first = per_stage[0][size]
        kinds = {m[size].kind for m in per_stage}
        out.append(Served(size, first.calls, sum(m[size].median_ms for m in per_stage),
                          first.kind if len(kinds) == 1 else GENERAL, first.scheduled))
    return out


def _merge(by_size: dict[int, Served], s: Served) -> None:
    old = by_size.get(s.size)
    if old is None or s.median_ms > old.median_ms:  # another rank: the slowest one's
        by_size[s.size] = s


def traffic(served: list[Served]) -> dict[int, int]:
    """How many forwards had each scheduled token count (the sizes the run served)."""
    out: dict[int, int] = defaultdict(int)
    for s in served:
        for n, c in s.scheduled.items():
            out[n] += c
    return out


def recommend(served: list[Served], budget: int) -> Recommendation:
    """The sizes to compile or capture for this run's traffic (see the module's text)."""
    if not served:
        raise ReportError("the run served nothing (no timed calls): nothing to tune")
    if not any(s.median_ms > 0 for s in served):
        raise ReportError("the run has no timings (every median is 0): nothing to tune")
    counts = traffic(served)
    if len(counts) < 2:
        raise ReportError(f"the run served one size only ({next(iter(counts))}): nothing "
                          "to choose between; tune on a run with the traffic to serve")
    total = sum(counts.values())
    # the time the run took per step, as it ran (each forward at the size it ran at)
    now_ms = sum(s.calls * s.median_ms for s in served) / sum(s.calls for s in served)
    fast = Curve({s.size: s.median_ms for s in served if s.kind != GENERAL})
    general = Curve({s.size: s.median_ms for s in served if s.kind == GENERAL})
    notes = []
    if total < THIN_CALLS:
        notes.append(f"only {total} forwards: every figure here rests on little; serve more "
                     "traffic before trusting it")
    if any(s.kind == CAPTURED for s in served):
        rec = _capture(counts, fast, general, budget, served, now_ms)
    elif fast and general:
        rec = _compile(counts, fast, general, budget, now_ms)
    else:
        rec = _thin(counts, general or fast, budget, now_ms)
    rec.notes = notes + rec.notes
    return rec


def _now_by_tokens(served: list[Served]) -> dict[int, float]:
    """Per scheduled count: the time its forwards took as the run ran them (summed)."""
    out: dict[int, float] = defaultdict(float)
    for s in served:
        for n, c in s.scheduled.items():
            out[n] += c * s.median_ms
    return out


def _capture(traffic: dict[int, int], fast: Curve, general: Curve, budget: int,
             served: list[Served], now_ms: float) -> Recommendation:
    import numpy as np

    sizes = sorted(traffic)
    counts = np.array([traffic[n] for n in sizes], dtype=np.float64)
    prefix = np.concatenate([[0.0], np.cumsum(counts)])
    t_fast = np.array([fast.at(n) for n in sizes])
    m = len(sizes)
    # tail[i]: the steps larger than sizes[i - 1] run eagerly (inf: no eager data to tell)
    eager = np.array([general.at(n) if general else np.inf for n in sizes]) * counts
    tail = np.concatenate([np.cumsum(eager[::-1])[::-1], [0.0]])
    best = prefix[1:] * t_fast  # one size, the i-th, covering every step up to it
    back = [np.full(m, -1)]
    total_best = best + tail[1:]
    choice = (1, int(np.argmin(total_best)))
    best_cost = float(total_best[choice[1]])
    for k in range(2, min(budget, m) + 1):
        new = np.full(m, np.inf)
        arg = np.full(m, -1)
        for i in range(k - 1, m):
            cand = best[:i] + (prefix[i + 1] - prefix[1:i + 1]) * t_fast[i]
            j = int(np.argmin(cand))
            new[i], arg[i] = cand[j], j
        best = new
        back.append(arg)
        totals = best + tail[1:]
        i = int(np.argmin(totals))
        if totals[i] < best_cost:
            best_cost, choice = float(totals[i]), (k, i)
    notes = []
    if general and tail[0] < best_cost:  # no capture at all is better still
        chosen: list[int] = []
        best_cost = float(tail[0])
        notes.append("running eagerly beats every capture-size choice for this traffic")
    else:
        k, i = choice
        picked = [i]
        while k > 1:
            i = int(back[k - 1][i])
            picked.append(i)
            k -= 1
        chosen = sorted(sizes[i] for i in picked)
    if not general:
        notes.append("no step ran eagerly: the largest size must cover the largest step")
    total = float(prefix[-1])
    now = _now_by_tokens(served)
    gains: dict[int, float] = {}
    for n in sizes:
        j = bisect_left(chosen, n)
        new_ms = fast.at(chosen[j]) if j < len(chosen) else general.at(n)
        if j < len(chosen):
            gains[chosen[j]] = gains.get(chosen[j], 0.0) + (now[n] - traffic[n] * new_ms) / total
    return Recommendation("capture", chosen, gains, now_ms, best_cost / total,
                          {"cudagraph_capture_sizes": chosen} if chosen else {}, notes)


def _compile(traffic: dict[int, int], fast: Curve, general: Curve, budget: int,
             now_ms: float) -> Recommendation:
    total = sum(traffic.values())
    savings = {n: c * (general.at(n) - fast.at(n)) / total for n, c in traffic.items()}
    ranked = [n for n in sorted(savings, key=savings.__getitem__, reverse=True)
              if savings[n] > 0]
    chosen = sorted(ranked[:budget])
    notes = []
    if any(not (fast.covers(n) and general.covers(n)) for n in chosen):
        notes.append("some gains are extrapolated past the sizes measured each way")
    expected = sum(c * (fast.at(n) if n in chosen else general.at(n))
                   for n, c in traffic.items()) / total
    return Recommendation("compile", chosen, {n: savings[n] for n in chosen}, now_ms, expected,
                          {"compile_sizes": chosen} if chosen else {}, notes)


def _thin(traffic: dict[int, int], curve: Curve, budget: int, now_ms: float) -> Recommendation:
    share = {n: c * curve.at(n) for n, c in traffic.items()}
    chosen = sorted(sorted(share, key=share.__getitem__, reverse=True)[:budget])
    note = ("every size ran on the same kind of graph: this run cannot tell what a "
            "specialised or captured graph would save. The sizes below carry the most time; "
            "try them, then confirm with `fxflops tune THIS_RUN NEW_RUN`")
    return Recommendation("thin", chosen, {}, now_ms, None, {"compile_sizes": chosen}, [note])


# --- several runs: confirm sizes (``fxflops tune BASE SIZED``) ----------------------


def size_times(runs: list[list[dict[str, Any]]]) -> dict[str, dict[int, list[tuple[float, int]]]]:
    """{"general"|"specialised": {size: [(median ms, calls), ...]}} over all runs (each
    run: its reports)."""
    out: dict[str, dict[int, list[tuple[float, int]]]] = {
        "general": defaultdict(list), "specialised": defaultdict(list)}
    for reports in runs:
        for rep in reports:
            # symbols and meta are optional in a report (a graph without: no size symbols)
            static_sizes = {r["size"] for g in rep["graphs"] if not g.get("symbols")
                            for r in g["rows"] if isinstance(r["size"], int)}
            compile_sizes = ((g.get("meta") or {}).get("compile_size") for g in rep["graphs"])
            static_sizes |= {s for s in compile_sizes if s is not None}
            if rep["forward"]:
                timed = {r["size"]: (r["median_ms"], r["calls"]) for r in rep["forward"]}
            else:  # no whole-forward rows: sum the graphs' medians per size
                timed = {}
                for g in rep["graphs"]:
                    for r in g["rows"]:
                        if isinstance(r["size"], int):
                            ms, calls = timed.get(r["size"], (0.0, 0))
                            timed[r["size"]] = (ms + r["median_ms"], max(calls, r["calls"]))
            for size, (ms, calls) in timed.items():
                if isinstance(size, int):
                    kind = "specialised" if size in static_sizes else "general"
                    out[kind][size].append((ms, calls))
    return out


def confirm(times: dict[str, dict[int, list[tuple[float, int]]]],
            threshold: float) -> list[dict[str, Any]]:
    """Runs with and without specialised graphs (``size_times``): per size seen both ways,
    the gain of the specialised graph over the general one, recommended past
    ``threshold``, ranked by gain weighted by the size's share of the calls."""
    gen, spec = times["general"], times["specialised"]
    both = sorted(set(gen) & set(spec))
    if not both:
        raise ReportError("no size was run both with and without a specialised graph: "
                          "run once without compile_sizes and once with them")
    total_calls = sum(c for s in both for _, c in gen[s] + spec[s]) or 1
    rows = []
    for s in both:
        g = min(ms for ms, _ in gen[s])
        sp = min(ms for ms, _ in spec[s])
        calls = sum(c for _, c in gen[s] + spec[s])
        gain = g / sp - 1 if sp else 0.0
        rows.append({"size": s, "general_ms": g, "specialised_ms": sp, "gain": gain,
                     "calls": calls, "weight": calls / total_calls,
                     "score": gain * calls / total_calls, "recommend": gain > threshold})
    return sorted(rows, key=lambda r: r["score"], reverse=True)
