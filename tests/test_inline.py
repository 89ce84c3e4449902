"""An eager graph's forward with the CPU-clock bookkeeping written into it
(``fxflops/instrument/inline.py``): what it runs, where it hands a call on, and where it
declines (the wrapping function of ``wrap.hot_function`` then runs)."""

from __future__ import annotations

import traceback

import pytest
import torch

from fxflops.cost.binder import SizeBinder
from fxflops.instrument.inline import Bookkeeping, inline_forward, wrapper
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

    def note(row, ns):  # as ``wrap.hot_function``'s: it counts the sampled call and says
        n = row.count  # when the next is due
        handed.append(("note", row, n, ns))
        row.count, row.due = n + 1, n + 16

    def miss(error, args):
        handed.append(("miss", type(error).__name__, args))
        return gm.forward(*args)

    binder = SizeBinder(list(sources))
    result = inline_forward(gm.forward, "fxflops_graph7", binder.expression,
                            Bookkeeping(rows, lambda: next(clock), note, miss))
    return result, handed


def row(size: int, count: int, due: int) -> SizeStats:
    """A row of ``count`` calls whose next sample is due at the ``due``-th."""
    r = SizeStats((size,), size)
    r.count, r.due = count, due
    return r


def test_an_untimed_call_runs_the_graphs_lines_and_is_counted_as_it_returns():
    gm = traced()
    rows = {3: row(3, 5, 16)}
    (forward, _), handed = made(gm, rows)
    x = torch.randn(3, 4)
    assert forward.__self__ is gm and forward.__name__ == "fxflops_graph7"
    assert torch.equal(forward(x, 2), gm.forward(x, 2))
    assert rows[3].count == 6 and handed == []


def test_a_sampled_call_is_timed_around_the_graphs_lines_and_an_unknown_size_handed_on():
    gm = traced()
    rows = {3: row(3, 16, 16)}  # the 16th call is due: sampled
    (forward, _), handed = made(gm, rows)
    x = torch.randn(3, 4)
    assert torch.equal(forward(x, 1), gm.forward(x, 1))
    assert handed == [("note", rows[3], 16, 1000)]  # two clock reads, one call apart
    assert rows[3].count == 17  # counted once, by ``note``
    assert torch.equal(forward(x, 1), gm.forward(x, 1))  # the next is due at the 32nd
    assert rows[3].count == 18 and len(handed) == 1
    y = torch.randn(5, 4)
    assert torch.equal(forward(y, 1), gm.forward(y, 1))
    assert handed[1:] == [("miss", "KeyError", (y, 1))]


def test_a_call_that_raises_is_not_counted_and_its_traceback_shows_the_line():
    gm = traced()
    rows = {3: row(3, 5, 16), 2: row(2, 32, 32)}  # the second one sampled
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
    first, second = {3: row(3, 5, 16)}, {3: row(3, 9, 16)}
    (forward, rebind), _ = made(gm, first)
    rebind(second)
    forward(torch.randn(3, 4), 0)
    assert (first[3].count, second[3].count) == (5, 10)


def test_a_key_over_several_sizes_and_an_int_argument():
    gm = traced()
    rows = {(3, 2): row(3, 5, 16)}
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
    assert inline_forward(w.forward, "g", SizeBinder([]).expression,
                          Bookkeeping({}, print, print, print)) is None

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

    # a ``global`` statement (not FX's, and not writable twice in one body)
    globbed = traced()
    globbed._code = globbed.code.replace(":\n", ":\n    global y\n", 1)
    assert "global y" in globbed.code
    assert made(globbed, {})[0] is None


@pytest.mark.parametrize("kind", ["unpacked", "boxed", "aot"])
def test_a_wrapper_calls_the_inner_as_its_convention_asks_with_the_key_written_in(kind):
    """``wrapper``: the function the hot path is where the inner is not an eager graph's
    forward. It calls the inner with the arguments unpacked, as one list (boxed), or
    with parameters put first (AOTAutograd's forward taken apart); its key is an
    expression over them (here a tensor's size and an int); it counts an untimed call as
    it returns, hands a sampled one to ``note`` with the clock read around the inner, a
    call of a size not in its rows to ``miss`` with the arguments as it got them, a
    raising one to no one; and it takes rebound rows."""
    weight = torch.randn(4)
    seen: list = []

    def inner(*args):
        if kind != "unpacked":  # one list, as AOTAutograd's boxed functions take
            (args,) = args
        seen.append(list(args))
        x, k = args[-2:]
        return torch.relu(x * weight) + k

    handed: list = []
    clock = iter(range(1000, 10**9, 1000))

    def note(row, ns):
        n = row.count
        handed.append(("note", n, ns))
        row.count, row.due = n + 1, n + 16

    def miss(error, args):
        handed.append(("miss", type(error).__name__, args))

    rows = {(3, 2): row(3, 5, 16)}
    books = Bookkeeping(rows, lambda: next(clock), note, miss)
    key = SizeBinder([("s0", 0, 0), ("s1", 1, None)]).expression
    params = [torch.zeros(1)] if kind == "aot" else None
    call, rebind = wrapper(inner, "fxflops_graph9", key, books, boxed=kind == "boxed",
                           params=params)
    x = torch.randn(3, 4)
    args = ([x, 2],) if kind == "boxed" else (x, 2)
    assert call.__name__ == "fxflops_graph9"
    assert torch.equal(call(*args), torch.relu(x * weight) + 2)
    assert seen[-1] == ([*params, x, 2] if params else [x, 2])
    assert rows[(3, 2)].count == 6 and handed == []
    rows[(3, 2)].count = 16  # due: sampled
    call(*args)
    assert handed == [("note", 16, 1000)] and rows[(3, 2)].count == 17
    y = torch.randn(5, 4)
    other = ([y, 2],) if kind == "boxed" else (y, 2)
    call(*other)
    assert handed[1:] == [("miss", "KeyError", other[0] if kind == "boxed" else other)]
    with pytest.raises(RuntimeError) as raised:
        call(*(([torch.randn(3, 5), 2],) if kind == "boxed" else (torch.randn(3, 5), 2)))
    assert rows[(3, 2)].count == 17
    assert "<fxflops fxflops_graph9 #" in "".join(traceback.format_exception(raised.value))
    moved = {(3, 2): row(3, 40, 48)}
    rebind(moved)
    call(*args)
    assert (rows[(3, 2)].count, moved[(3, 2)].count) == (17, 41)


def test_a_written_functions_source_is_kept_for_tracebacks_while_it_lives():
    """``linecache`` holds a written function's source while the function lives, and lets
    it go with it (a process that compiles again and again does not grow by it)."""
    import gc
    import linecache

    books = Bookkeeping({}, lambda: 0, lambda *a: None, lambda error, args: None)
    call, _ = wrapper(lambda *a: None, "fxflops_graph11", SizeBinder([]).expression, books)
    filename = call.__code__.co_filename
    assert filename.startswith("<fxflops fxflops_graph11 #")
    assert "_fxflops_rows[()]" in "".join(linecache.getlines(filename))
    del call, _
    gc.collect()
    assert filename not in linecache.cache
