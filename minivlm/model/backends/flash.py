"""flash-attn's paged kernels: both phases straight from the paged cache, as nano-vllm does (varlen prefill,
kv-cache decode). They serve CUDA in fp16/bf16 with pages of a multiple of 256 tokens (flash-attn 2's page size);
flash-attn is optional (no binary wheel on PyPI)."""
import torch
import torch.nn.functional as F

from minivlm.model.backends.base import Attention, Said

try:
    from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
except ImportError:
    flash_attn_varlen_func = flash_attn_with_kvcache = None
ENABLED = True  # False: another attention even where flash-attn is installed (comparisons: tools/gpu_check.py)


class FlashAttention(Attention):
    name = "flash-attn"

    @classmethod
    def runs_on(cls, model, config) -> bool:
        return torch.device(model.device).type == "cuda" and ENABLED

    @classmethod
    def serves(cls, model, config) -> Said | None:
        if flash_attn_with_kvcache is None:
            return Said("engine.why_flash_missing")
        if model.dtype not in (torch.float16, torch.bfloat16) or config.block_size % 256:
            return Said("engine.why_flash_shape")
        return None

    def attend(self, q, k, v, k_cache, v_cache, meta, scale):
        tables = meta.block_tables.to(torch.int32)
        if not meta.is_prefill:
            return flash_attn_with_kvcache(q[:, None], k_cache, v_cache, cache_seqlens=meta.ctx_lens_t.to(torch.int32),
                                           block_table=tables, softmax_scale=scale, causal=True)[:, 0]
        cu_q = F.pad(torch.tensor(meta.q_lens, device=q.device).cumsum(0), (1, 0)).to(torch.int32)
        cu_k = F.pad(meta.ctx_lens_t.cumsum(0), (1, 0)).to(torch.int32)
        return flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, max(meta.q_lens), max(meta.ctx_lens),
                                      softmax_scale=scale, causal=True, block_table=tables)

    def describe(self) -> Said:
        return Said("engine.attn_flash")

