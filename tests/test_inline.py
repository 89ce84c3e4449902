"""An eager graph's forward with the CPU-clock bookkeeping written into it
(``fxflops/instrument/inline.py``): what it runs, where it hands a call on, and where it
declines (the wrapping function of ``wrap.hot_function`` then runs)."""

from __future__ import annotations

import traceback

import pytest
import torch

from fxflops.cost.binder import SizeBinder
from fxflops.instrument.inline import inline_forward
from fxflops.recording.size_stats import SizeStats


class Scale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor, k: int) -> torch.Tensor:
        return torch.relu(x * self.weight) + k


def traced() -> torch.fx.GraphModule:
    return torch.fx.symbolic_trace(Scale())


def made(gm: torch.fx.GraphModule, rows: dict, sources=(("s0", 0, 0),)):
    handed: list = []
    clock = iter(range(1000, 10**9, 1000))  # each read 1,000 ns after the one before

    def note(row, n, ns):  # as ``wrap.hot_function``'s: it counts the sampled call
        handed.append(("note", row, n, ns))
        row.count = n + 1

    def miss(error, args):
        handed.append(("miss", type(error).__name__, args))
        return gm.forward(*args)

    binder = SizeBinder(list(sources))
    result = inline_forward(gm.forward, "fxflops_graph7", binder.expression, rows,
                            lambda: next(clock), note, miss)
    return result, handed


def row(size: int, count: int, mask: int) -> SizeStats:
    r = SizeStats((size,), size)
    r.count, r.sample_mask = count, mask
    return r


def test_an_untimed_call_runs_the_graphs_lines_and_is_counted_as_it_returns():
    gm = traced()
    rows = {3: row(3, 5, 15)}
    (forward, _), handed = made(gm, rows)
    x = torch.randn(3, 4)
    assert forward.__self__ is gm and forward.__name__ == "fxflops_graph7"
    assert torch.equal(forward(x, 2), gm.forward(x, 2))
    assert rows[3].count == 6 and handed == []


def test_a_sampled_call_is_timed_around_the_graphs_lines_and_an_unknown_size_handed_on():
    gm = traced()
    rows = {3: row(3, 16, 15)}  # 16 & 15 == 0: this call is sampled
    (forward, _), handed = made(gm, rows)
    x = torch.randn(3, 4)
    assert torch.equal(forward(x, 1), gm.forward(x, 1))
    assert handed == [("note", rows[3], 16, 1000)]  # two clock reads, one call apart
    assert rows[3].count == 17  # counted once, by ``note``
    assert torch.equal(forward(x, 1), gm.forward(x, 1))  # 17 & 15: not sampled
    assert rows[3].count == 18 and len(handed) == 1
    y = torch.randn(5, 4)
    assert torch.equal(forward(y, 1), gm.forward(y, 1))
    assert handed[1:] == [("miss", "KeyError", (y, 1))]


def test_a_call_that_raises_is_not_counted_and_its_traceback_shows_the_line():
    gm = traced()
    rows = {3: row(3, 5, 15), 2: row(2, 32, 15)}  # the second one sampled
    (forward, _), handed = made(gm, rows)
    with pytest.raises(RuntimeError) as raised:
        forward(torch.randn(3, 5), 0)  # 5 columns against 4 weights
    with pytest.raises(RuntimeError):
        forward(torch.randn(2, 5), 0)
    assert (rows[3].count, rows[2].count, handed) == (5, 32, [])
    text = "".join(traceback.format_exception(raised.value))
    assert "<fxflops fxflops_graph7 #" in text and "mul = x * weight" in text


def test_rebound_rows_take_the_next_call():
    gm = traced()
    first, second = {3: row(3, 5, 15)}, {3: row(3, 9, 15)}
    (forward, rebind), _ = made(gm, first)
    rebind(second)
    forward(torch.randn(3, 4), 0)
    assert (first[3].count, second[3].count) == (5, 10)


def test_a_key_over_several_sizes_and_an_int_argument():
    gm = traced()
    rows = {(3, 2): row(3, 5, 15)}
    (forward, _), handed = made(gm, rows, sources=(("s0", 0, 0), ("s1", 1, None)))
    forward(torch.randn(3, 4), 2)
    assert rows[(3, 2)].count == 6 and handed == []


def test_it_declines_what_is_not_fxs_shape():
    """A callable that is not a graph module's generated forward, a forward with a
    default, and a graph whose names could be fxflops' own: None (the wrapping function
    runs)."""
    gm = traced()
    assert made(gm, {})[0] is not None

    class Wrapped(torch.nn.Module):  # not a GraphModule
        def forward(self, x):
            return x

    w = Wrapped()
    assert inline_forward(w.forward, "g", SizeBinder([]).expression, {}, print, print,
                          print) is None

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    k = graph.placeholder("k", default_value=2)
    graph.output(graph.call_function(torch.add, (x, k)))
    with_default = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert "k = 2" in with_default.code
    assert made(with_default, {})[0] is None

    graph = torch.fx.Graph()
    ours = graph.placeholder("_fxflops_row")
    graph.output(graph.call_function(torch.neg, (ours,)))
    clashing = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert made(clashing, {})[0] is None

    # a key over an argument the forward does not take
    assert made(gm, {}, sources=(("s0", 5, 0),))[0] is None
