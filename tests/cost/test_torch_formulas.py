"""fxflops' matmul formulas beside torch's registry, whatever the installed torch counts.

fxflops adds its own formula for an op only where torch's ``flop_registry`` lacks one
(``TORCH_EXTRAS``: CPU SDPA before torch 2.15, grouped mm); where torch has one, torch's is
used. Both ways are run here on one torch, torch's registry patched for the test: the totals
are FlopCounterMode's plus the documented extra where torch lacks the op, and
FlopCounterMode's alone where it has it. And fxflops' own set-up never breaks the model: a
built-in formula module that raises at import leaves the graph uninstrumented, said once.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count, shape_wrapper

import fxflops
from fxflops.cost.formulas import aten as builtin
from fxflops.cost.registry import DuplicateRegistration, register_formula
from tests import procs

CPU_SDPA = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
CPU_SDPA_OPS = (CPU_SDPA, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward)
MARK = 7  # what the patched registry's formula adds: only torch's formula counts it


@pytest.fixture
def torch_registry():
    """torch's flop registry, to patch: restored, and fxflops' table rebuilt from it, after."""
    saved = dict(flop_counter.flop_registry)
    yield flop_counter.flop_registry
    flop_counter.flop_registry.clear()
    flop_counter.flop_registry.update(saved)
    builtin.load_torch_formulas()


class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def counts(q, k, v) -> tuple[int, int]:
    """(fxflops' matmul FLOPs of one compiled call, FlopCounterMode's of the eager call)."""
    torch._dynamo.reset()
    rec = fxflops.recorder()
    compiled = torch.compile(Attention(), backend=fxflops.backend(inner="eager"))
    before = {(g.id, k): r.count for g in rec.graphs for k, r in g.rows.items()}
    with torch.no_grad():
        compiled(q, k, v)
        with FlopCounterMode(display=False) as counter:
            Attention()(q, k, v)
    moved = [r for g in rec.graphs for key, r in g.rows.items()
             if r.count != before.get((g.id, key), 0)]
    assert moved, "no instrumented graph ran"
    return sum(r.cost.matmul_flops for r in moved), counter.get_total_flops()


def qkv() -> tuple[torch.Tensor, ...]:
    return torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8)


def test_an_op_torch_lacks_is_counted_by_fxflops_on_top_of_flop_counter_mode(torch_registry):
    for op in CPU_SDPA_OPS:  # torch before 2.15, on any torch
        torch_registry.pop(op, None)
    builtin.load_torch_formulas()
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in builtin.torch_lacks()
    q, k, v = qkv()
    got, fcm = counts(q, k, v)
    assert fcm == 0  # FlopCounterMode counts nothing of CPU SDPA
    assert got == fcm + sdpa_flop_count(q.shape, k.shape, v.shape) == 2 * 2 * 2 * 4 * 16 * 16 * 8


def test_an_op_torch_counts_is_counted_by_torch_formula_alone(torch_registry):
    # torch 2.15 and later, on any torch: a formula of torch's own (marked, so that only its
    # use can give the count) where fxflops has an extra of its own
    torch_registry[CPU_SDPA] = shape_wrapper(
        lambda q, k, v, *args, out_shape=None, **kwargs: sdpa_flop_count(q, k, v) + MARK)
    builtin.load_torch_formulas()
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" not in builtin.torch_lacks()
    q, k, v = qkv()
    got, fcm = counts(q, k, v)
    assert fcm == sdpa_flop_count(q.shape, k.shape, v.shape) + MARK
    assert got == fcm


def test_the_installed_torch_decides_which_extras_are_used():
    """On the torch installed, each extra is in the table exactly where torch lacks the op,
    and every op torch counts is counted by torch's formula (never an extra of fxflops')."""
    from fxflops.cost.registry import FORMULAS

    have = {builtin.op_name(t) for t in flop_counter.flop_registry}
    lacks = set(builtin.torch_lacks())
    assert lacks == set(builtin.TORCH_EXTRAS) - have
    for name, extra in builtin.TORCH_EXTRAS.items():
        used = FORMULAS[name]
        assert (used is extra) == (name in lacks) or name in builtin._ATTENTION_HEADS, name
    print(f"torch {torch.__version__}: fxflops adds {sorted(lacks)}")


def test_a_users_duplicate_registration_is_still_refused():
    """``DuplicateRegistration`` stays the user's clear error (an op fxflops already costs),
    and ``override=True`` replaces on purpose."""
    with pytest.raises(DuplicateRegistration, match="aten::mm"):
        register_formula(torch.ops.aten.mm, kind="matmul")(lambda *a, **k: 0)


BROKEN_FORMULAS = textwrap.dedent("""
    import importlib.abc, logging, sys
    import torch

    class Broken(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "fxflops.cost.formulas.aten":
                raise RuntimeError("a built-in formula module that raises")

    sys.meta_path.insert(0, Broken())
    logging.basicConfig(format="WARN %(message)s")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = torch.compile(model, backend="inductor")(x)
        torch._dynamo.reset()
        via_name = torch.compile(model, backend="fxflops")(x)
        torch._dynamo.reset()
        import fxflops
        via_backend = torch.compile(model, backend=fxflops.backend())(x)
    assert torch.equal(via_name, expected) and torch.equal(via_backend, expected)
    rec = fxflops.recorder()
    print("instrumented", len(rec.graphs), "uninstrumented",
          sum(g.calls for g in rec.uninstrumented))
""")


def test_a_formula_module_that_raises_leaves_the_model_running_said_once(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text(BROKEN_FORMULAS)
    result = procs.run([sys.executable, str(script)], timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "instrumented 0 uninstrumented 2" in result.stdout, result.stdout
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARN fxflops")]
    assert len(warnings) == 1, result.stderr[-3000:]
    assert "a built-in formula module that raises" in warnings[0]
    assert "fxflops.cost.formulas.aten" in warnings[0]
