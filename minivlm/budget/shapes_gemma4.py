"""Gemma 4's dimensions from its transformers config (gemma4 and gemma4_unified), as ModelShape fields.

What sets Gemma 4 apart for the budget: each layer's K/V shape comes from the config's per_layer_config (sliding
layers: num_key_value_heads × head_dim; full layers: global_head_dim and, where attention_k_eq_v is set,
num_global_key_value_heads), the last num_kv_shared_layers layers keep no K/V of their own, a second embedding table
feeds every layer (per-layer embeddings), the 26B-A4B adds experts beside the dense MLP, and the towers differ: a
ViT with 2-D RoPE and pooling (gemma4), or no encoder at all, merged pixel patches through one linear
(gemma4_unified); E2B / E4B carry a conformer audio tower, the 12B raw waveform frames."""

GEMMA4 = ("gemma4", "gemma4_unified")


def per_layer_kv(t) -> tuple[tuple[int, int], ...]:
    """(KV heads, head_dim) of every decoder layer, read from per_layer_config (the global head_dim is ambiguous)."""
    return tuple((layer.num_key_value_heads, layer.head_dim) for layer in t.per_layer_config)


def gemma4_text_dims(t) -> dict:
    """The Gemma 4 decoder's fields of ModelShape: per-layer K/V shapes, shared layers, PLE, double-wide MLPs, MoE."""
    kv = per_layer_kv(t)
    sliding = next((kv[i] for i, kind in enumerate(t.layer_types) if kind == "sliding_attention"), kv[0])
    full = next((kv[i] for i, kind in enumerate(t.layer_types) if kind == "full_attention"), kv[0])
    moe = bool(getattr(t, "enable_moe_block", False))
    return dict(layer_kv=kv, kv_heads=sliding[0], head_dim=sliding[1], global_kv_heads=full[0],
                global_head_dim=full[1], k_eq_v=bool(getattr(t, "attention_k_eq_v", False)),
                kv_shared_layers=int(getattr(t, "num_kv_shared_layers", 0) or 0),
                ple_dim=int(getattr(t, "hidden_size_per_layer_input", 0) or 0),
                ple_vocab=int(getattr(t, "vocab_size_per_layer_input", 0) or 0),
                double_wide_mlp=bool(getattr(t, "use_double_wide_mlp", False)),
                experts=int(t.num_experts or 0) if moe else 0,
                expert_intermediate=int(t.moe_intermediate_size or 0) if moe else 0,
                top_k_experts=int(t.top_k_experts or 0) if moe else 0)


def gemma4_vision_dims(cfg) -> dict:
    """The vision fields: gemma4's tower (a ViT whose 2-D position table has position_embedding_size rows per axis,
    pooled pooling_kernel_size² → 1) or gemma4_unified's encoder-free patch embedder (model patches of
    (patch · pool)² · 3 pixels, a factorized table of mm_posemb_size rows per axis)."""
    v, hidden = cfg.vision_config, cfg.text_config.hidden_size
    if v is None:
        return dict(vision_width=0, vision_intermediate=0, vision_depth=0, vision_heads=0, vision_out=0,
                    patch_size=0, temporal_patch_size=0, merge_size=0, in_channels=0, num_position_embeddings=0,
                    deepstack=0)
    common = dict(patch_size=v.patch_size, temporal_patch_size=1, merge_size=v.pooling_kernel_size, in_channels=3,
                  vision_out=hidden, deepstack=0)
    if cfg.model_type == "gemma4_unified":
        return dict(common, vision_kind="gemma4_patches", vision_width=v.mm_embed_dim, vision_intermediate=0,
                    vision_depth=0, vision_heads=0, num_position_embeddings=v.mm_posemb_size,
                    vision_proj_in=v.output_proj_dims)
    return dict(common, vision_kind="gemma4_vision", vision_width=v.hidden_size,
                vision_intermediate=v.intermediate_size, vision_depth=v.num_hidden_layers,
                vision_heads=v.num_attention_heads, vision_kv_heads=v.num_key_value_heads,
                vision_head_dim=v.head_dim, num_position_embeddings=v.position_embedding_size,
                vision_proj_in=v.hidden_size)


def gemma4_audio_dims(cfg) -> dict:
    """The audio tower's widths (counted as weights the engine does not load: minivlm serves images and text)."""
    a = getattr(cfg, "audio_config", None)
    if a is None:
        return {}
    if cfg.model_type == "gemma4_unified":  # raw waveform frames: only the embedder's projection
        return dict(audio_kind="gemma4_frames", audio_out=a.audio_embed_dim)
    return dict(audio_kind="gemma4_conformer", audio_width=a.hidden_size, audio_depth=a.num_hidden_layers,
                audio_heads=a.num_attention_heads, audio_conv_channels=tuple(a.subsampling_conv_channels),
                audio_conv_kernel=a.conv_kernel_size, audio_out=a.output_proj_dims)
