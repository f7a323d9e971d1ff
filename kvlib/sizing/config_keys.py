"""Which ``config.json`` keys the reader knows, which it ignores on purpose, and the rule (chapter 2).

A calculator that skips a key it does not understand gives a silently wrong size: reading
only ``layer_types`` sizes Gemma-3 (``sliding_window_pattern``) 10.7x too low and
Nemotron-H (``hybrid_override_pattern``) 13x too high. So :func:`check_keys` refuses any
key that *looks* as if it could change the cache (its name matches
:data:`SIZE_RELEVANT`) unless the reader reads it (:data:`KNOWN_KEYS`) or ignores it for
a stated reason (:data:`IGNORED_KEYS`: the key is about weights, training, tokens, RoPE
frequencies or the vision tower, none of which changes how many K/V bytes a token adds).
Keys that match nothing (``vocab_size``, ``torch_dtype`` ...) pass.

The rule, then: a key that cannot change the cache is ignored (:func:`ignored_keys` lists them,
``python -m kvlib size --verbose`` prints them); a key that could is read, or refused by name.
"""

from __future__ import annotations

import re

from kvlib import KVLibError

# A key whose name contains one of these could change the cache's size.
SIZE_RELEVANT = re.compile(
    r"window|layer|types|kv|key_value|head|attn|attention|pattern|chunk|latent|lora|rank|interval|"
    r"period|offset|block|hybrid|cross|query|multi|group|position|seq|ctx|context|dim|embd|hidden|"
    r"d_model|mamba|ssm|linear|global|local|sparse|share|_config$|n_layer|num_layers|n_head|encoder|decoder"
)

# Keys the reader reads (kvlib/sizing/config_reader.py and layer_pattern.py).
KNOWN_KEYS = frozenset(
    {
        # layers, heads, widths (and their older spellings)
        "num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_transformer_layers",
        "num_attention_heads", "n_head", "n_heads", "num_heads", "num_query_heads",
        "hidden_size", "n_embd", "d_model", "model_dim",
        "num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query", "new_decoder_architecture",
        "multi_query_attention", "multi_query_group_num", "kv_channels", "attn_config", "kv_n_heads",
        "head_dim", "attention_head_dim", "d_kv",
        # the longest context
        "max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length",
        "max_context_length", "max_sequence_length", "max_target_positions", "max_source_positions",
        # which layers cache, and how much
        "layer_types", "sliding_window", "use_sliding_window", "max_window_layers",
        "sliding_window_pattern", "attention_chunk_size", "no_rope_layers", "no_rope_layer_interval",
        "attn_layer_indices", "hybrid_override_pattern", "attn_layer_period", "attn_layer_offset",
        "full_attention_interval", "cross_attention_layers", "sliding_window_size", "attn_type",
        "order_of_interleaved_layers", "layers_block_type", "_sliding_window_pattern",
        # MLA
        "kv_lora_rank", "qk_rope_head_dim",
        # encoder-decoder models, nested multimodal configs
        "is_encoder_decoder", "encoder_layers", "decoder_layers", "num_decoder_layers",
        "decoder_attention_heads", "text_config", "vision_config",
        "image_size", "patch_size", "max_num_tiles",
        "model_type", "_name_or_path", "pre_seq_len",
    }
)  # fmt: skip

# Keys that look size-relevant but are not: each group says why it cannot change K/V bytes.
IGNORED_KEYS = frozenset(
    {
        # weights and feed-forward widths: parameters, not cache
        "intermediate_size", "ffn_dim", "decoder_ffn_dim", "encoder_ffn_dim", "n_inner", "d_ff",
        "ffn_hidden_size", "moe_intermediate_size", "shared_expert_intermediate_size",
        "moe_shared_expert_intermediate_size", "ffn_config", "ffn_multipliers", "qkv_multipliers",
        "num_gqa_groups", "tie_word_embeddings", "share_input_output_layers", "hidden_act",
        "hidden_activation", "first_k_dense_replace", "moe_layer_freq", "n_group", "topk_group",
        "q_lora_rank", "qk_nope_head_dim", "v_head_dim", "interleave_moe_layer_step", "moe_layers",
        "decoder_sparse_step", "mlp_only_layers", "expert_layer_period", "expert_layer_offset",
        "rotary_dim", "partial_rotary_factor", "rope_local_base_freq", "rope_scaling", "rope_theta",
        "rope_parameters", "rotary_emb_base", "rotary_pct", "use_parallel_residual", "parallel_attn",
        "position_embedding_type", "scale_embedding", "alibi", "attn_logit_softcapping",
        "final_logit_softcapping", "query_pre_attn_scalar", "attention_bias", "attention_dropout",
        "attn_pdrop", "attention_probs_dropout_prob", "hidden_dropout", "hidden_dropout_prob",
        "attention_multiplier", "residual_multiplier", "embedding_multiplier", "logits_scaling",
        "attn_temperature_tuning", "floor_scale", "attention_layernorm", "use_qk_norm", "qk_layernorm",
        "normalize_qk_projections", "apply_residual_connection_post_layernorm", "add_qkv_bias",
        "attention_softmax_in_fp32", "apply_query_key_layer_scaling", "post_layer_norm",
        "encoder_attention_heads", "encoder_layerdrop", "decoder_layerdrop", "layerdrop",
        "num_mel_bins", "decoder_start_token_id", "relative_attention_num_buckets",
        "relative_attention_max_distance", "layer_norm_epsilon", "layer_norm_eps", "rms_norm_eps",
        "initializer_range", "init_std", "embd_pdrop", "resid_pdrop", "summary_first_dropout",
        "n_routed_experts", "n_shared_experts", "num_experts", "num_local_experts",
        "num_experts_per_tok", "router_aux_loss_coef", "output_router_logits",
        "dense_layer_norm", "hidden_size_per_head", "use_cache", "classifier_dropout",
        "activation_dropout", "dropout", "dropout_rate", "torch_dtype", "mm_tokens_per_image",
        "boi_token_index", "eoi_token_index", "image_token_index", "image_token_id",
        "vision_start_token_id", "vision_end_token_id", "vision_token_id", "video_token_id",
        "quantization_config", "tie_encoder_decoder", "add_cross_attention",
        "vision_feature_layer", "vision_feature_select_strategy", "multimodal_projector_bias",
        "projector_hidden_act", "text_config_dict",
        # Mamba layers keep a fixed-size state, no KV cache (chapter 5 sizes that state)
        "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_dt_rank", "mamba_conv_bias",
        "mamba_proj_bias", "use_mamba_kernels", "mamba_n_heads", "mamba_d_head", "mamba_n_groups",
        "mamba_chunk_size", "mamba_num_heads", "mamba_head_dim", "mamba_hidden_act", "ssm_state_size",
        "mamba_d_ssm", "n_groups", "mamba_rms_norm", "mamba_dt_min", "mamba_dt_max", "mamba_dt_limit",
        "mamba_dt_init_floor", "mamba_dt_scale", "mamba_dt_init", "time_step_limit", "time_step_min",
        "time_step_max", "time_step_floor", "chunk_size", "conv_kernel", "use_conv_bias",
        "residual_in_fp32", "mlp_hidden_act", "linear_conv_kernel_dim", "linear_key_head_dim",
        "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads",
        "num_logits_to_keep", "shared_attention_norm",
        # MPT's attn_config entries that do not change the cache
        "attn_impl", "clip_qkv", "qk_ln", "softmax_scale", "prefix_lm", "attn_uses_sequence_id",
        "alibi_bias_max", "rope", "rope_impl", "rope_dail_config", "rope_hf_config", "qk_gn",
        "fused_qkv",
        # ChatGLM's and Whisper's spellings of things that do not change the cache
        "add_bias_linear", "layernorm_epsilon", "use_weighted_layer_sum", "apply_spec_augment",
        "mask_time_length", "mask_time_min_masks", "mask_time_prob", "mask_feature_length",
        "mask_feature_min_masks", "mask_feature_prob", "median_filter_width", "encoder_layers_to_keep",
        "word_embed_proj_dim", "do_layer_norm_before",
        # DeepSeek-V3's multi-token-prediction layer: used only for speculative decoding, not cached
        # in plain serving (vLLM sizes it only with --speculative-config)
        "num_nextn_predict_layers", "mtp_layers_block_type",
        # transformers' to_dict() entries about outputs, kernels and numerics
        "chunk_size_feed_forward", "is_decoder", "output_attentions", "output_hidden_states",
        "qk_head_dim", "reorder_and_upcast_attn", "scale_attn_by_inverse_layer_idx", "scale_decoder_outputs",
        "use_mambapy", "mamba_ssm_cache_dtype", "moe_latent_size", "moe_shared_expert_overlap",
        "num_ln_in_parallel_attn", "use_bidirectional_attention",
        # attention scaling, norms and initialisation: how values are computed, not how many are kept
        "scale_attn_weights", "scale_attention_softmax_in_fp32", "attn_scale", "attn_rotary_emb",
        "normalization_layer_name", "add_final_layer_norm", "init_config", "ffn_dim_divisor", "seq_aux",
        "shared_intermediate_size", "_attn_implementation_autoset", "pre_allocate_kv_cache",
        # BLOOM's ALiBi offset and Megatron fused-bias switch (skip_bias_add_qkv, in BLOOM's configs),
        # StableLM-2's q/k/v biases, transformers' choice of attention kernel (InternLM2.5): how
        # scores are computed, not how many K/V values are kept
        "offset_alibi", "skip_bias_add_qkv", "use_qkv_bias", "attn_implementation", "_attn_implementation",
        # the context before RoPE scaling (the model's maximum is max_position_embeddings)
        "original_max_position_embeddings", "initial_context_length",
    }
)  # fmt: skip

# Mllama's vision tower and Gemma-3's/Qwen2-VL's: keys read only for Llama-3.2-Vision's image tokens.
VISION_KEYS_READ = ("image_size", "patch_size", "max_num_tiles")


def check_keys(config: dict, where: str = "config") -> None:
    """Refuse any key of ``config`` that could change the cache and that kvlib neither reads nor ignores."""
    for key in config:
        if not isinstance(key, str):
            continue
        if key in KNOWN_KEYS or key in IGNORED_KEYS or not SIZE_RELEVANT.search(key):
            continue
        shown = repr(key) if len(key) <= 80 else repr(key[:60]) + f"... ({len(key):,} characters)"
        raise KVLibError(
            f"{where} has the key {shown}, which could change the KV cache's size and which kvlib "
            "does not understand; remove it if it does not apply, or report it"
        )


# The nested objects whose keys the reader checks like the top level's.
NESTED_CHECKED = ("text_config", "attn_config")


def ignored_keys(config: dict) -> list[str]:
    """The keys of ``config`` (and of its text_config and attn_config, as ``text_config.key``) that
    kvlib does not read: the ones :data:`IGNORED_KEYS` names and those no size-relevant name matches.

    None of them can change the cache's size (:func:`check_keys` refuses the others), so the
    reader ignores them; ``python -m kvlib size --verbose`` lists them. The vision tower's keys
    are not listed: only :data:`VISION_KEYS_READ` of them are read.
    """
    ignored = []
    for prefix, part in (("", config), *((f"{k}.", config.get(k)) for k in NESTED_CHECKED)):
        if not isinstance(part, dict):
            continue
        for key in part:
            if isinstance(key, str) and key not in KNOWN_KEYS:
                ignored.append(prefix + key)
    return ignored
