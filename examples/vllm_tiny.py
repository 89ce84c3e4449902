"""A tiny dummy-weight Llama under vLLM with fxflops: nothing is downloaded.

    python examples/vllm_tiny.py OUT_DIR [--mode 2|3] [--backend fxflops] [--tp N] [--pp N]
        [--cache DIR]

Writes one fxflops report per process (rank) into OUT_DIR. Used by the tests too.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

# tiny configs of the families vLLM serves: hidden 256, 2 layers, 4 heads of 64
ARCHS: dict[str, dict] = {
    "llama": {},
    # a 64-token vocabulary: every token a model makes already appears in a 54-token prompt,
    # so that n-gram speculative decoding finds drafts in the context
    "llama_v64": {"vocab_size": 64},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
              "intermediate_size": 768, "num_key_value_heads": 1},
    # mixture of experts: 4 experts, 2 per token
    "mixtral": {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None},
    # another MoE: routed experts beside a gated shared expert
    "qwen2_moe": {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
                  "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
                  "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1,
                  "mlp_only_layers": [], "norm_topk_prob": False},
    # one sliding window for every layer
    "mistral": {"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                "sliding_window": 64},
    # alternating local (sliding) and global layers
    "gemma2": {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
               "head_dim": 64, "sliding_window": 64, "query_pre_attn_scalar": 64,
               "attn_logit_softcapping": None, "final_logit_softcapping": None,
               "hidden_activation": "gelu_pytorch_tanh"},
    # MLA (DeepSeek's real latent sizes: 512 + 64 = 576) with routed and shared experts
    "deepseek_v2": {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
                    "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64,
                    "qk_nope_head_dim": 128, "v_head_dim": 128, "n_routed_experts": 4,
                    "num_experts_per_tok": 2, "n_shared_experts": 1,
                    "moe_intermediate_size": 256, "first_k_dense_replace": 1,
                    "moe_layer_freq": 1, "topk_method": "greedy", "n_group": 1,
                    "topk_group": 1, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
                    "norm_topk_prob": False, "rope_scaling": None},
    # hybrids: three Gated DeltaNet (linear attention) layers and one full attention layer,
    # with MoE (CPU's GDN kernels take head dims 64 and 128, key dim = value dim)
    "qwen3_next": {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
                   "num_hidden_layers": 4, "head_dim": 64, "linear_conv_kernel_dim": 4,
                   "linear_key_head_dim": 64, "linear_value_head_dim": 64,
                   "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                   "layer_types": ["linear_attention"] * 3 + ["full_attention"],
                   "full_attention_interval": 4, "num_experts": 4, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 256, "shared_expert_intermediate_size": 256,
                   "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
                   "partial_rotary_factor": 0.25,
                   "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                       "rope_type": "default"}},
    # Mamba2 hybrid: a Mamba2 mixer, an MLP, attention, an MLP ("M-*-")
    "nemotron_h": {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
                   "num_hidden_layers": 4, "hybrid_override_pattern": "M-*-", "head_dim": 64,
                   "mamba_num_heads": 8, "mamba_head_dim": 64, "ssm_state_size": 64,
                   "n_groups": 1, "expand": 2, "conv_kernel": 4, "chunk_size": 64,
                   "use_conv_bias": True, "mamba_hidden_act": "silu", "mlp_hidden_act": "relu2",
                   "mlp_bias": False, "use_bias": False, "attention_bias": False,
                   "layer_norm_epsilon": 1e-05, "residual_in_fp32": False,
                   "time_step_limit": [0.0, float("inf")], "rescale_prenorm_residual": True},
}


def tiny_llama(path: str, arch: str = "llama", **overrides: object) -> str:
    """A config-only model folder: vLLM builds it with load_format='dummy'."""
    os.makedirs(path, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 10240, "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16", "hidden_act": "silu",
        "tie_word_embeddings": False,
    }
    cfg.update(ARCHS[arch])
    cfg.update(overrides)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    return path


def tiny_lora(model: str, rank: int) -> str:
    """A PEFT adapter of ``rank`` on the q/k/v/o projections of the tiny model's layers."""
    import torch
    from safetensors.torch import save_file

    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head = cfg.get("head_dim") or hidden // heads
    kv = cfg["num_key_value_heads"] * head
    shapes = {"q_proj": (hidden, heads * head), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
              "o_proj": (heads * head, hidden)}
    path = os.path.join(model, f"lora-r{rank}")
    os.makedirs(path, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for i in range(cfg["num_hidden_layers"]):
        for proj, (n_in, n_out) in shapes.items():
            key = f"base_model.model.model.layers.{i}.self_attn.{proj}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, n_in, generator=gen) * 0.01
            tensors[f"{key}.lora_B.weight"] = torch.randn(n_out, rank, generator=gen) * 0.01
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"r": rank, "lora_alpha": 2 * rank, "target_modules": list(shapes),
                   "bias": "none", "peft_type": "LORA"}, f)
    return path


def share_model_infos(cache: str) -> None:
    """vLLM inspects each model class in a subprocess of its own (seconds: it imports vLLM)
    unless the ``modelinfos`` folder under VLLM_CACHE_ROOT knows it already, keyed by its
    source's hash: a cache root of this run's own shares the default root's, so that only
    the compiled artifacts are this run's."""
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm"
    mine = Path(cache) / "modelinfos"
    if mine.exists() or mine.is_symlink():
        return
    (default / "modelinfos").mkdir(parents=True, exist_ok=True)
    mine.parent.mkdir(parents=True, exist_ok=True)
    try:
        mine.symlink_to(default / "modelinfos", target_is_directory=True)
    except FileExistsError:  # (another run made it first)
        pass


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--mode", type=int, default=2)
    p.add_argument("--backend", default="fxflops")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel stages")
    p.add_argument("--arch", default="llama")
    p.add_argument("--cache", default=None, help="VLLM_CACHE_ROOT (reuse for a warm start)")
    p.add_argument("--dump", default=None, help="vLLM's debug_dump_path (depyf + fxflops dumps)")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--phases", nargs="+", default=None, metavar="LEN[,LEN...]",
                   help="instead of --prompts: one generate call per phase, with one prompt "
                        "per length (e.g. 16 160,160: one short request alone, then two long "
                        "ones decoding together)")
    p.add_argument("--prefix-caching", action="store_true", help="vLLM's prefix caching")
    p.add_argument("--chunk", type=int, default=None, metavar="N",
                   help="max_num_batched_tokens: longer prompts are prefilled in chunks of N")
    p.add_argument("--block-size", type=int, default=None, help="KV-cache block size")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--mfu-metrics", action="store_true",
                   help="vLLM's own estimate of each step (--enable-mfu-metrics)")
    spec = p.add_mutually_exclusive_group()
    spec.add_argument("--ngram", type=int, default=0, metavar="K",
                      help="speculative decoding by n-gram lookup, K draft tokens a step")
    spec.add_argument("--draft", type=int, default=0, metavar="K",
                      help="speculative decoding by a draft model (a one-layer tiny Llama of "
                           "the same vocabulary, its own dummy weights), K draft tokens a step")
    p.add_argument("--draft-hidden", type=int, default=None, metavar="H",
                   help="the draft model's hidden size (the target's by default): heads of "
                        "64, H/64 of them, one KV head per 128, an FFN of 2H")
    p.add_argument("--lora", type=int, default=0, metavar="R",
                   help="serve the prompts through a LoRA adapter of rank R on every "
                        "attention projection (made here, random weights)")
    p.add_argument("--print-metrics", action="store_true",
                   help="print vLLM's own estimate and spec-decode counters at the end "
                        "(one 'vllm-metrics {json}' line)")
    args = p.parse_args()
    os.environ["FXFLOPS_OUT"] = os.path.abspath(args.out)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.cache:
        os.environ["VLLM_CACHE_ROOT"] = os.path.abspath(args.cache)
        share_model_infos(args.cache)
    workers = args.tp * args.pp
    if workers > 1:  # one core per worker (vllm-cpu binds each worker's OpenMP threads)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(map(str, range(workers))))
    from vllm import LLM, SamplingParams

    model = tiny_llama(os.path.join(tempfile.gettempdir(), f"fxflops-tiny-{args.arch}"), args.arch)
    extra: dict = {}
    if args.prefix_caching:
        extra["enable_prefix_caching"] = True
    if args.chunk:
        extra.update(enable_chunked_prefill=True, max_num_batched_tokens=args.chunk)
    if args.block_size:
        extra["block_size"] = args.block_size
    if args.mfu_metrics:  # vLLM computes its estimate only where it logs stats
        extra.update(enable_mfu_metrics=True, disable_log_stats=False)
    if args.ngram:
        extra["speculative_config"] = {"method": "ngram", "num_speculative_tokens": args.ngram,
                                       "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    if args.draft:
        narrow = {} if args.draft_hidden is None else {
            "hidden_size": args.draft_hidden, "intermediate_size": 2 * args.draft_hidden,
            "num_attention_heads": args.draft_hidden // 64,
            "num_key_value_heads": max(1, args.draft_hidden // 128)}
        draft = tiny_llama(os.path.join(tempfile.gettempdir(),
                                        f"fxflops-tiny-{args.arch}-draft{args.draft_hidden or ''}"),
                           args.arch, num_hidden_layers=1, **narrow)
        extra["speculative_config"] = {"method": "draft_model", "model": draft,
                                       "num_speculative_tokens": args.draft}
    lora_request = None
    if args.lora:
        from vllm.lora.request import LoRARequest

        extra.update(enable_lora=True, max_loras=1, max_lora_rank=max(8, args.lora))
        lora_request = LoRARequest("tiny", 1, tiny_lora(model, args.lora))
    compilation: dict = {"mode": args.mode, "backend": args.backend}
    if args.mode == 3 and args.backend == "fxflops":
        # LLM(...) makes its compilation config before vLLM loads any plugin, and vLLM
        # refuses a backend of its own choosing in mode 3: the mode is left to vLLM (3,
        # piecewise, wherever it compiles so: -O1 to -O3, its default)
        del compilation["mode"]
    if args.dump:
        compilation["debug_dump_path"] = args.dump
    llm = LLM(model=model, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=512, gpu_memory_utilization=0.3, tensor_parallel_size=args.tp,
              pipeline_parallel_size=args.pp, kv_cache_dtype=args.kv_cache_dtype,
              compilation_config=compilation, max_num_seqs=8, seed=0, **extra)
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True, detokenize=False)
    if args.phases:
        for phase in args.phases:
            lens = [int(n) for n in phase.split(",")]
            prompts = [{"prompt_token_ids": [(7 * i + j) % 9000 + 10 for j in range(n)]}
                       for i, n in enumerate(lens)]
            outs = llm.generate(prompts, params, lora_request=lora_request)
            print("generated", [len(o.outputs[0].token_ids) for o in outs], "for prompts", lens)
        if args.print_metrics:
            print_metrics(llm)
        return
    prompts = [{"prompt_token_ids": list(range(10 + 7 * i, 10 + 7 * i + 12 + 5 * i))}
               for i in range(args.prompts)]
    outs = llm.generate(prompts, params, lora_request=lora_request)
    print("generated", [len(o.outputs[0].token_ids) for o in outs])
    if args.print_metrics:
        print_metrics(llm)


def print_metrics(llm) -> None:
    """vLLM's own counters of its estimate and of speculative decoding, summed over their
    label sets (the engine's)."""
    wanted = ("vllm:estimated_", "vllm:spec_decode_num_")
    values: dict[str, float] = {}
    for m in llm.get_metrics():
        if m.name.startswith(wanted) and hasattr(m, "value"):
            values[m.name] = values.get(m.name, 0) + m.value
    print("vllm-metrics", json.dumps(values, sort_keys=True))


if __name__ == "__main__":
    main()
