"""The paged KV pool: how many blocks fit the memory budget, the one tensor that holds them, what it costs."""
import logging

import torch

from minivlm.config import EngineConfig
from minivlm.device import free_memory_bytes, peak_bytes
from minivlm.loader import LoadedModel
from minivlm.engine.outputs import MemoryReport

log = logging.getLogger("minivlm")


def derive_num_blocks(config: EngineConfig, model: LoadedModel) -> int:
    """KV blocks that fit the memory budget (the same formula as minivlm.budget), capped at what
    max_num_seqs requests of max_model_len tokens could ever use."""
    from minivlm.budget import estimate
    device, weights = model.device, model.weights_bytes()
    est = estimate(model.hf_config, dtype=model.dtype_name, kv_dtype=model.dtype_name,
                   max_model_len=config.max_model_len, num_seqs=config.max_num_seqs,
                   max_num_batched_tokens=config.max_num_batched_tokens, block_size=config.block_size,
                   gpu_memory_utilization=1.0 if device.type == "cpu" else config.gpu_memory_utilization,
                   device_memory_bytes=free_memory_bytes(device, config.cpu_memory_budget_bytes)
                   + (weights if device.type != "cpu" else 0), weights_bytes=weights)  # CPU: a budget already
    if est.num_blocks < 1:
        raise ValueError(f"no memory left for the KV cache on {device} after {weights / 2**30:.2f} GiB of weights; "
                         f"raise gpu_memory_utilization or pass num_blocks")
    return min(est.num_blocks, config.max_num_seqs * -(-config.max_model_len // config.block_size))


class KVPool:
    """kv_cache[0 | 1, layer] is layer's K | V cache, shaped [num_blocks, block_size, kv_heads, head_dim]."""

    def __init__(self, config: EngineConfig, model: LoadedModel):
        self.config, self.model = config, model
        text_cfg = model.text_config
        layers, heads, dim = text_cfg.num_hidden_layers, text_cfg.num_key_value_heads, text_cfg.head_dim
        self.kv_bytes_per_token = 2 * layers * heads * dim * model.dtype.itemsize
        self.num_blocks = config.num_blocks or derive_num_blocks(config, model)
        self.kv_cache = torch.zeros(2, layers, self.num_blocks, config.block_size, heads, dim,
                                    dtype=model.dtype, device=model.device)
        tokens = self.num_blocks * config.block_size
        log.info("minivlm: %s on %s (%s) | KV cache: %d blocks x %d = %d tokens | max concurrency %.2fx at %d tokens",
                 model.model_type, model.device, model.dtype_name, self.num_blocks, config.block_size, tokens,
                 tokens / config.max_model_len, config.max_model_len)

    def memory_report(self) -> MemoryReport:
        """What is allocated now: weights, the pool (0 once released), and the device's peak where it can tell."""
        kv = self.kv_cache.nbytes if self.kv_cache is not None else 0
        tokens = self.num_blocks * self.config.block_size
        return MemoryReport(self.model.weights_bytes(), kv, self.kv_bytes_per_token, self.num_blocks,
                            self.config.block_size, peak_bytes(self.model.device), str(self.model.device),
                            self.model.dtype_name, self.model.vision.num_bytes() if self.model.vision else 0, tokens,
                            tokens / self.config.max_model_len, self.model.weight_copies_bytes())

    def release(self):
        self.kv_cache = None
