"""How tensor parallelism splits a Qwen-VL model over N GPUs (vLLM's layout); every size here is per GPU.

- Column-parallel linears split their output features: q/k/v (by heads), gate/up (MLP width), the vision qkv,
  MLP fc1 / gate / up and the merger's first layer. Their biases split with them.
- Row-parallel linears split their input features: o_proj, down_proj, the vision proj / fc2 / down and the merger's
  last layer. Their biases are not split: each GPU keeps the whole bias (only rank 0 adds it).
- Embedding and lm_head are vocab-parallel: each GPU holds vocab / N rows (vLLM pads the vocabulary to a multiple
  of 64 first; the Qwen vocabularies already are one).
- Norms, the patch embedding and Qwen3-VL's position table are replicated.
- KV heads: each GPU holds kv_heads / N of them; with fewer KV heads than GPUs every GPU keeps one, so N / kv_heads
  GPUs hold copies of the same head (vLLM replicates them the same way). So N must divide the KV heads, or the KV
  heads N; Gemma 4 checks each count it has (sliding layers', full layers' num_global_key_value_heads).
- Experts (Gemma 4 26B-A4B) split each expert's MLP width like the dense MLP's (vLLM's FusedMoE without expert
  parallelism), so N must divide it too.
- The vision tower is split like the LLM (vLLM's default for Qwen-VL) when its heads and MLP width divide by N;
  otherwise it is replicated whole on every GPU (the data-parallel encoder vLLM falls back to).
Activations that are hidden-size wide (layer input, residual, norms) are full on every GPU; head- and MLP-wide ones
are split.
"""
from minivlm.budget.shapes import ModelShape


def check_tensor_parallel(s: ModelShape, tp: int) -> None:
    """Refuse a split vLLM refuses: attention heads, the MLP width (and each expert's) must divide by the number of
    GPUs, and the number of GPUs must divide the KV heads or be a multiple of them (every KV head count the model
    has: Gemma 4's sliding and full layers differ)."""
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor_parallel_size must be a positive int, got {tp!r}")
    linear = (("Gated DeltaNet key heads", s.linear_k_heads), ("Gated DeltaNet value heads", s.linear_v_heads)) \
        if s.linear_v_heads else ()
    experts = (("expert MLP intermediate size", s.expert_intermediate),) if s.experts else ()
    for what, n in (("attention heads", s.heads), ("MLP intermediate size", s.intermediate)) + linear + experts:
        if n % tp:
            raise ValueError(f"tensor_parallel_size {tp} does not divide the model's {n} {what}; "
                             f"pick a size that divides {n}")
    for n in sorted({h for h, _ in s.layer_kv} or {s.kv_heads}):
        if (n % tp if n >= tp else tp % n):
            raise ValueError(f"tensor_parallel_size {tp} does not divide the model's {n} KV heads, nor is it a "
                             f"multiple of them; pick a size that divides {n} or that {n} divides")


def split(n: int, tp: int) -> int:
    """Per-GPU share of a dimension that check_tensor_parallel (or vision_split) has shown to divide evenly."""
    return n // tp


def kv_heads_per_gpu(kv_heads: int, tp: int) -> int:
    """KV heads one GPU stores: kv_heads / tp, at least 1 (fewer KV heads than GPUs: each GPU keeps a copy of one)."""
    return max(1, kv_heads // tp)


def vocab_per_gpu(vocab: int, tp: int) -> int:
    """Rows of the vocab-parallel embedding / lm_head on one GPU."""
    return -(-vocab // tp)


def vision_split(s: ModelShape, tp: int) -> int:
    """The factor the vision tower is split by: tp when its heads and MLP width divide by tp, else 1 (replicated)."""
    return tp if s.vision_heads % tp == 0 and s.vision_intermediate % tp == 0 else 1
