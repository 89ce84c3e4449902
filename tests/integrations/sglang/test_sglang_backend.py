"""The pieces of the SGLang integration that need no SGLang, on any torch (the main suite;
SGLang's own functions drive them in tests/integrations/sglang/test_sglang.py, scripts/sglang_leg.sh):
fxflops' backend takes ``torch.compile``'s ``mode=`` (torch hands it to a custom backend;
SGLang's decode compile passes ``"max-autotune-no-cudagraphs"``), and the compile gate
gives fxflops' backend to the ``torch.compile`` call made inside an SGLang compile site,
and to no other."""

from __future__ import annotations

import contextlib

import pytest
import torch

import fxflops
from fxflops.integrations.sglang import compiles


@pytest.fixture
def gate():
    fxflops.reset_recorder()
    patch = compiles.install_compile_gate()
    yield patch
    patch.undo()
    fxflops.reset_recorder()


def test_the_backend_takes_mode_and_rows_follow_the_sizes():
    """``mode=`` reaches fxflops' backend (no "unexpected keyword"), and with
    ``dynamic=False`` each size is a graph of its own, its row at that size."""
    fxflops.reset_recorder()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.SiLU()).eval()
    compiled = torch.compile(model, backend=fxflops.backend(name="m{index}"),
                             mode="max-autotune-no-cudagraphs", dynamic=False)
    with torch.no_grad():
        for bs in (1, 2):
            x = torch.randn(bs, 16)
            torch.testing.assert_close(compiled(x), model(x))
    rows = {g.name: [(r.size, r.count, r.cost.matmul_flops) for r in g.all_rows()]
            for g in fxflops.recorder().graphs_snapshot()}
    assert sorted(v[0][:2] for v in rows.values()) == [(1, 1), (2, 1)]
    assert sorted(v[0][2] for v in rows.values()) == [2 * 16 * 32, 2 * 2 * 16 * 32]
    fxflops.reset_recorder()


@contextlib.contextmanager
def sglang_like_patch_model(model, enable_compile, num_tokens, tp_group):
    """SGLang 0.5.23's ``patch_model`` as it calls torch.compile (its signature, and a
    compile with ``mode=`` and no backend)."""
    if enable_compile:
        yield torch.compile(torch.no_grad()(model.forward), mode="max-autotune-no-cudagraphs",
                            dynamic=False)
    else:
        yield model.forward


def test_the_gate_gives_the_site_fxflops_backend_and_no_one_else(gate):
    model = torch.nn.Linear(8, 8).eval()
    hook = compiles.wrap_patch_model("sglang-decode")
    x = torch.randn(3, 8)
    with hook(sglang_like_patch_model, model, True, 3, None) as forward:
        torch.testing.assert_close(forward(x), model(x).detach())
    outside = torch.compile(torch.nn.Linear(8, 8))  # outside any site: plain Inductor
    outside(torch.randn(2, 8))
    with hook(sglang_like_patch_model, model, False, 5, None) as forward:
        assert forward == model.forward  # a size SGLang does not compile: untouched
    names = [g.name for g in fxflops.recorder().graphs_snapshot()]
    assert names == ["sglang-decode:size3"]
    (row,) = fxflops.recorder().graphs_snapshot()[0].all_rows()
    assert (row.size, row.count) == (3, 1)


def test_a_backend_named_by_the_site_is_left_as_named(gate):
    seen = []

    def mine(gm, example_inputs, **kwargs):
        seen.append(kwargs)
        return gm.forward

    token = compiles._SITE.set("sglang-cpu:size1")
    try:
        compiled = torch.compile(torch.nn.Linear(4, 4), backend=mine)
    finally:
        compiles._SITE.reset(token)
    compiled(torch.randn(1, 4))
    assert seen == [{}] and fxflops.recorder().graphs_snapshot() == []
