"""How every vLLM op that is not costed by a formula is counted, and why.

vLLM registers about 600 custom ops across its releases and builds (``scripts/vllm_ops.py``
lists them). Each is one of: *costed* (a formula: ``ops``, ``kernels``, ``gpu``, ``ssm``),
*inside* (a kernel that runs only inside another op a graph holds, counted by that op's
formula: ``fxflops.cost.registry.register_inside``), *zero* (in a model's forward, but no
FLOPs by design: the groups below) or *not a compute op* (never in a forward graph: set-up,
queries, the sampler). tests/integrations/vllm/test_vllm_ops.py checks that every op
of the installed vLLM and of the newest release's census is one of these, and
docs/coverage.md has the counts.
"""

from __future__ import annotations

from fxflops.cost.registry import register_not_compute, register_zero_flop

# --- zero FLOPs by design -------------------------------------------------------------

# Communication between ranks (tensor, sequence, data and context parallelism; CPU shared-memory
# collectives): the adds of a reduction are not the model's FLOPs.
register_zero_flop(
    "_C::beam_allreduce", "_C::direct_dcp_a2a_lse_reduce", "_C::direct_dcp_kv_gather",
    "_C::direct_dcp_q_gather", "_C::shm_all_gather", "_C::shm_allreduce", "_C::shm_gather",
    "_C::shm_recv_tensor_list", "_C::shm_send_tensor_list", "_C_custom_ar::all_reduce",
    "_C_custom_ar::custom_all_gather", "_C_custom_ar::custom_reduce_scatter",
    "_C_custom_ar::mnnvl_lamport_all_gather", "_C_custom_ar::mnnvl_lamport_reduce_scatter",
    "_C_custom_ar::mnnvl_multimem_reduce_scatter", "_C_custom_ar::qr_all_reduce",
    "vllm::all_gather", "vllm::all_reduce", "vllm::all_reduce_symmetric_with_copy",
    "vllm::cohere2_mlp_fork", "vllm::cohere2_mlp_join", "vllm::reduce_scatter",
    "vllm::sequence_parallel_chunk_impl", "vllm::sp_reduce_scatter", "vllm::sp_shard",
)

# KV-cache writes, gathers, concatenations and dtype conversions: bytes, not arithmetic.
register_zero_flop(
    "_C::concat_and_cache_mla_cpu", "_C::cpu_attn_reshape_and_cache",
    "_C::fused_kimi_k3_mla_decode_q_concat_ds_mla_insert",
    "_C::fused_kimi_k3_mla_decode_q_concat_kv_cache_fp8_insert",
    "_C::fused_kimi_k3_mla_decode_q_concat_kv_cache_insert",
    "_C::fused_kimi_k3_mla_key_concat_ds_mla_insert",
    "_C::fused_kimi_k3_mla_key_concat_kv_cache_insert", "_C::fused_kimi_k3_mla_kv_concat",
    "_C::fused_kimi_k3_mla_kv_concat_quant_fp8",
    "_C::fused_kimi_k3_mla_qkv_quant_kv_cache_fp8_insert", "_C::octave_cache_store",
    "_C::octave_window_store", "_C::save_partial_states_cpu",
    "_C_cache_ops::concat_and_cache_mla", "_C_cache_ops::concat_and_cache_mla_grouped",
    "_C_cache_ops::concat_mla_q", "_C_cache_ops::convert_fp8",
    "_C_cache_ops::cp_gather_and_upconvert_fp8_kv_cache",
    "_C_cache_ops::cp_gather_and_upconvert_nvfp4_kv_cache", "_C_cache_ops::cp_gather_cache",
    "_C_cache_ops::cp_gather_indexer_k_quant_cache",
    "_C_cache_ops::gather_and_maybe_dequant_cache", "_C_cache_ops::indexer_k_quant_and_cache",
    "_C_cache_ops::reshape_and_cache", "_C_cache_ops::reshape_and_cache_flash",
    "_moe_C::moe_gather", "vllm::flashinfer_concat_mla_k", "vllm::maybe_populate_sink",
    "vllm::unified_kv_cache_update", "vllm::unified_mla_kv_cache_update",
)

# Quantising and dequantising activations or weights: a scale and a cast per element move bytes;
# the FLOPs are the GEMM's that follows (counted on the GEMM).
register_zero_flop(
    "_C::awq_dequantize", "_C::dynamic_per_token_scaled_fp8_quant",
    "_C::dynamic_scaled_fp8_quant", "_C::dynamic_scaled_int8_quant", "_C::mxfp4_experts_quant",
    "_C::per_token_group_fp8_quant", "_C::per_token_group_fp8_quant_packed",
    "_C::per_token_group_quant_int8", "_C::per_token_group_quant_mxfp4",
    "_C::quantize_fp8e4m3_vec", "_C::scaled_fp4_experts_quant", "_C::scaled_fp4_quant",
    "_C::static_scaled_fp8_quant", "_C::static_scaled_int8_quant", "vllm::dequant_mxfp4",
    "vllm::dequant_mxfp6", "vllm::flashinfer_mxfp4_quantize",
    "vllm::flashinfer_mxfp8_quantize_8x4", "vllm::flashinfer_nvfp4_quantize",
    "vllm::mxfp8_quantize", "vllm::quant_dequant_mxfp4", "vllm::quant_dequant_mxfp6",
    "vllm::rocm_aiter_group_fp8_quant", "vllm::rocm_aiter_per_tensor_quant",
    "vllm::rocm_aiter_per_token_quant", "vllm::triton_mx_block_rearrange",
    "vllm::xpu_mxfp4_quantize", "vllm::xpu_mxfp8_quantize",
    "vllm_helion::dynamic_per_token_scaled_fp8_quant", "vllm_helion::per_token_group_fp8_quant",
)

# A mixture of experts' token sorting, permutation and scatter: index arithmetic.
register_zero_flop(
    "_moe_C::batched_moe_align_block_size", "_moe_C::fused_globalize_align_block_size",
    "_moe_C::moe_align_block_size", "_moe_C::moe_lora_align_block_size", "_moe_C::moe_permute",
    "_moe_C::moe_permute_with_scratch", "_moe_C::moe_prepare_scatter", "_moe_C::moe_unpermute",
    "_moe_C::remap_hidden_states", "_moe_C::shuffle_rows",
)

# Top-k selection (sparse attention, indexers): comparisons, not FLOPs.
register_zero_flop(
    "_C::cooperative_topk", "_C::persistent_topk", "_C::top_k_per_row_decode",
    "_C::top_k_per_row_prefill", "_C::topk_transform_512_cpu", "deep_select::topk",
)

# Embedding lookups, n-gram ids and weight-prefetch ordering: gathers and index math.
register_zero_flop(
    "_C::ngram_compute_n_gram_ids", "_C::vocab_parallel_embedding",
    "vllm::modelopt_block_embedding_chunked", "vllm::qwen4_exp_amd_ple_ngram_embedding",
    "vllm::qwen4_exp_amd_ple_ngram_embedding_pinned", "vllm::qwen4_exp_amd_ple_ngram_ids",
    "vllm::start_prefetch", "vllm::wait_prefetch",
)

# --- not a compute op of a forward ----------------------------------------------------

# Weight packing and repacking at load time (process_weights_after_loading), and the
# weight-layout helpers of kernel libraries.
register_not_compute(
    "_C::awq_marlin_repack", "_C::causal_conv1d_weight_pack", "_C::convert_scale_packed",
    "_C::convert_weight_packed", "_C::convert_weight_packed_scale_zp",
    "_C::cutlass_encode_and_reorder_int4b", "_C::cutlass_encode_and_reorder_int4b_grouped",
    "_C::cutlass_pack_scale_fp8", "_C::float8_linear_prepack_cpu", "_C::gptq_marlin_repack",
    "_C::gptq_shuffle", "_C::machete_prepack_B", "_C::marlin_int4_fp8_preprocess",
    "_C::prepack_moe_weight", "_C::prepack_moe_weight_int8", "_flashmla_C::permute_q_b_proj",
    "zentorch::zentorch_is_fp16_supported", "zentorch::zentorch_weight_prepack_for_linear",
    "zentorch::zentorch_woq_repack_weight",
)

# Capability, size and configuration queries; library set-up.
register_not_compute(
    "_C::cpu_attn_has_isa", "_C::cpu_has_amx_fp8", "_C::cutlass_group_gemm_supported",
    "_C::cutlass_scaled_mm_supports_block_fp8", "_C::cutlass_scaled_mm_supports_fp4",
    "_C::cutlass_scaled_mm_supports_fp8", "_C::is_onednn_acl_supported",
    "_C::machete_supported_schedules", "_C::mxfp4_experts_quant_supported",
    "_C::sm100_cutlass_mla_get_workspace_size", "_C_cuda_utils::get_device_attribute",
    "_C_cuda_utils::get_max_shared_memory_per_block_device_attribute",
    "_flashkda_C::get_workspace_size", "_moe_C::moe_permute_sort_workspace_size",
    "_moe_C::moe_permute_unpermute_supported", "_xpu_C::is_xe2_arch", "_xpu_C::is_xe3_arch",
    "deep_gemm::_ensure_jit", "deep_gemm::_slice_symm_buffer_for_mega_moe",
    "deep_gemm::_slice_symm_buffer_for_nvfp4_mega_moe", "deep_gemm::get_block_m_for_mega_moe",
    "deep_gemm::get_block_m_for_nvfp4_mega_moe",
    "deep_gemm::get_mk_alignment_for_contiguous_layout", "deep_gemm::get_num_sms",
    "deep_gemm::get_pdl", "deep_gemm::get_symm_buffer_size_for_mega_moe",
    "deep_gemm::get_symm_buffer_size_for_nvfp4_mega_moe", "deep_gemm::get_tc_util",
    "deep_gemm::get_theoretical_mk_alignment_for_contiguous_layout",
    "deep_gemm::get_token_alignment_for_mega_moe",
    "deep_gemm::get_token_alignment_for_nvfp4_mega_moe", "deep_gemm::init",
    "deep_gemm::locality_domain_empty", "deep_gemm::locality_domain_empty_per_domain",
    "deep_gemm::locality_domain_get_balanced_sm_locality_domains",
    "deep_gemm::locality_domain_get_granularity",
    "deep_gemm::locality_domain_get_num_locality_domains",
    "deep_gemm::locality_domain_get_sm_locality_domains",
    "deep_gemm::locality_domain_is_localization_available",
    "deep_gemm::locality_domain_is_localized", "deep_gemm::locality_domain_release_mlopart",
    "deep_gemm::set_block_size_multiple_of", "deep_gemm::set_ignore_compile_dims",
    "deep_gemm::set_mk_alignment_for_contiguous_layout", "deep_gemm::set_num_sms",
    "deep_gemm::set_pdl", "deep_gemm::set_tc_util", "deep_gemm::shutdown",
    "deep_gemm::use_deterministic_algorithms", "deep_select::get_alignment_requirement",
)

# Scale-factor and weight layout helpers of DeepGEMM and FlashMLA (run on weights at load,
# or on scales beside a GEMM: layouts and sizes, no arithmetic).
register_not_compute(
    "deep_gemm::transform_sf_into_required_layout", "deep_gemm::get_tma_aligned_size",
    "deep_gemm::get_mn_major_tma_aligned_tensor",
    "deep_gemm::get_mn_major_tma_aligned_packed_ue8m0_tensor",
    "deep_gemm::get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor",
    "_flashmla_C::permute_wv_proj",
)

# Handles, memory and process management (oneDNN handlers, shared-memory managers, custom
# all-reduce buffers, host registration), KV-cache offload and residency.
register_not_compute(
    "_C::create_onednn_mm_handler", "_C::create_onednn_scaled_mm_handler",
    "_C::get_cuda_view_from_cpu_tensor", "_C::get_xpu_view_from_cpu_tensor",
    "_C::init_cpu_memory_env", "_C::init_shm_manager", "_C::join_shm_manager",
    "_C::release_dnnl_matmul_handler", "_C::weak_ref_tensor", "_C::xpu_host_register",
    "_C::xpu_host_unregister", "_C::xpu_memcpy_sync", "_C_cache_ops::getMemoryInfo",
    "_C_cache_ops::hisparse_gather_compact", "_C_cache_ops::hisparse_gather_plan",
    "_C_cache_ops::hisparse_invalidate_written_slots",
    "_C_cache_ops::hisparse_resolve_residency", "_C_cache_ops::swap_blocks",
    "_C_cache_ops::swap_blocks_batch", "_C_custom_ar::allocate_shared_buffer_and_handle",
    "_C_custom_ar::dispose", "_C_custom_ar::free_shared_buffer",
    "_C_custom_ar::get_graph_buffer_ipc_meta", "_C_custom_ar::init_custom_ar",
    "_C_custom_ar::init_custom_qr", "_C_custom_ar::meta_size", "_C_custom_ar::open_mem_handle",
    "_C_custom_ar::qr_destroy", "_C_custom_ar::qr_get_handle", "_C_custom_ar::qr_max_size",
    "_C_custom_ar::qr_open_handles", "_C_custom_ar::register_buffer",
    "_C_custom_ar::register_graph_buffers",
)

# Attention scheduler metadata, slot mappings, MoE problem sizes: the runner's bookkeeping.
register_not_compute(
    "_C::compute_slot_mapping_kernel_impl", "_C::get_cutlass_batched_moe_mm_data",
    "_C::get_cutlass_moe_mm_data", "_C::get_cutlass_moe_mm_problem_sizes_from_expert_offsets",
    "_C::get_scheduler_metadata", "_flashmla_extension_C::get_mla_decoding_metadata_dense_fp8",
    "_vllm_fa3_C::get_scheduler_metadata", "deep_gemm::get_mqa_logits_metadata",
    "deep_gemm::get_paged_sparse_mqa_logits_metadata",
    "deep_gemm::get_sparse_mqa_logits_metadata", "deep_gemm::get_paged_mqa_logits_metadata",
)

# The sampler's and speculative decoding's helpers: they run outside the compiled model.
register_not_compute(
    "_C::apply_repetition_penalties_", "_C::copy_and_expand_dflash_inputs_kernel_impl",
    "_C::copy_and_expand_eagle_inputs_kernel_impl",
    "_C::eagle_prepare_inputs_padded_kernel_impl",
    "_C::eagle_prepare_next_token_padded_kernel_impl",
    "_C::eagle_step_slot_mapping_metadata_kernel_impl", "_C::expand_kernel_impl",
    "_C::fused_gumbel_argmax", "_C::greedy_argmax", "_C::rejection_greedy_sample_kernel_impl",
    "_C::rejection_random_sample_kernel_impl", "_C::sample_recovered_tokens_kernel_impl",
    "_xpu_C::topk_topp_sampler", "vllm::xpu_topk_topp_sampler",
)

# Never in an inference forward graph: training-only and test-only ops, and a name vLLM lists
# among its splitting ops that no release registers.
register_not_compute(
    "_flashmla_C::dense_prefill_bwd", "vllm::function_with_mutated_args_and_return",
    "vllm::deepseek_v4_attention",
)
