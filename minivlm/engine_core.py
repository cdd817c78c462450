"""EngineCore: loads the checkpoint, sizes and allocates the KV pool, and turns sampled tokens into text,
finish reasons and outputs. Engine (engine.py) adds threads and the public calls on top."""
import logging

import torch
from transformers import GenerationConfig

from minivlm.block_manager import BlockManager
from minivlm.config import EngineConfig
from minivlm.device import free_memory_bytes, peak_bytes, pick_device, pick_dtype
from minivlm.loader import load_checkpoint
from minivlm.model.decoder import QwenVLDecoder
from minivlm.model.vision import VisionTower
from minivlm.prefix_keys import extend_keys
from minivlm.request import Output
from minivlm.runner import ModelRunner
from minivlm.scheduler import Scheduler
from minivlm.snapshot import MemoryReport, SnapshotBuilder, StreamEvent
from minivlm.vision_cache import VisionCache

log = logging.getLogger("minivlm")


class EngineCore:
    def __init__(self, config: EngineConfig, share_model_with: "EngineCore | None" = None):
        self.config = config
        if share_model_with is None:
            self._load_model(config)
        else:  # an isolated engine: the same weights and processor, its own KV pool and caches
            src = share_model_with
            for name in ("device", "dtype", "dtype_name", "model_type", "hf_config", "processor", "model_dir",
                         "model_id", "tokenizer", "decoder", "vision", "merge", "eos_ids"):
                setattr(self, name, getattr(src, name))
        self._build_kv_cache(config)

    def _load_model(self, config: EngineConfig):
        self.device = pick_device(config.device, config.model)
        self.dtype = pick_dtype(config.dtype, self.device)
        self.dtype_name = str(self.dtype).removeprefix("torch.")
        model_dir, self.model_type, self.hf_config, self.processor, text_sd, vision_sd = load_checkpoint(config.model)
        self.model_dir, self.model_id = model_dir, config.model
        self.tokenizer = self.processor.tokenizer
        text_cfg = self.hf_config.text_config
        tied = bool(getattr(self.hf_config, "tie_word_embeddings", False) or getattr(text_cfg, "tie_word_embeddings", False))
        with torch.device("meta"):  # no random init of weights we are about to overwrite
            self.decoder = QwenVLDecoder(self.model_type, text_cfg, tied)
        self.decoder.load_weights(text_sd, tied, self.device, self.dtype)
        self.decoder.eval()
        self.vision = VisionTower(self.model_type, self.hf_config.vision_config, vision_sd, self.device, self.dtype)
        self.merge = self.hf_config.vision_config.spatial_merge_size
        self.eos_ids = self._eos_ids(text_cfg, model_dir)

    def _build_kv_cache(self, config: EngineConfig):
        text_cfg = self.hf_config.text_config
        self.num_layers, self.kv_heads, self.head_dim = (text_cfg.num_hidden_layers, text_cfg.num_key_value_heads,
                                                         text_cfg.head_dim)
        self.kv_bytes_per_token = 2 * self.num_layers * self.kv_heads * self.head_dim * self.dtype.itemsize
        self.num_blocks = config.num_blocks or self._derive_num_blocks()
        self.kv_cache = torch.zeros(2, self.num_layers, self.num_blocks, config.block_size, self.kv_heads,
                                    self.head_dim, dtype=self.dtype, device=self.device)
        self.block_manager = BlockManager(self.num_blocks, config.block_size, config.cache_strategy != "none")
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens)
        self.snapshots = SnapshotBuilder(self.block_manager)
        self.vision_cache = VisionCache(config.vision_cache_bytes)
        self.runner = ModelRunner(self.decoder, self.vision, self.kv_cache, config.block_size, self.device,
                                  self.vision_cache, self.model_id, self.dtype_name)
        tokens = self.num_blocks * config.block_size
        log.info("minivlm: %s on %s (%s) | KV cache: %d blocks x %d = %d tokens | max concurrency %.2fx at %d tokens",
                 self.model_type, self.device, self.dtype_name, self.num_blocks, config.block_size, tokens,
                 tokens / config.max_model_len, config.max_model_len)

    def _eos_ids(self, text_cfg, model_dir: str) -> set[int]:
        """Every id that ends a turn: config, tokenizer and generation_config.json may each name some."""
        try:
            generation_eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
        except OSError:
            generation_eos = None
        ids = set()
        for v in (getattr(text_cfg, "eos_token_id", None), getattr(self.hf_config, "eos_token_id", None),
                  self.tokenizer.eos_token_id, generation_eos):
            ids.update(v if isinstance(v, (list, tuple)) else [v] if v is not None else [])
        return ids

    def weights_bytes(self) -> int:
        params = {id(p): p for p in self.decoder.parameters()}  # tied embeddings count once
        return sum(p.numel() * p.element_size() for p in params.values()) + self.vision.num_bytes()

    def _derive_num_blocks(self) -> int:
        """KV blocks that fit the memory budget (the same formula as minivlm.budget), capped at what
        max_num_seqs requests of max_model_len tokens could ever use."""
        from minivlm.budget import estimate
        utilization = 1.0 if self.device.type == "cpu" else self.config.gpu_memory_utilization  # CPU: a budget already
        est = estimate(self.hf_config, dtype=self.dtype_name, kv_dtype=self.dtype_name,
                       max_model_len=self.config.max_model_len, num_seqs=self.config.max_num_seqs,
                       max_num_batched_tokens=self.config.max_num_batched_tokens,
                       block_size=self.config.block_size, gpu_memory_utilization=utilization,
                       device_memory_bytes=free_memory_bytes(self.device, self.config.cpu_memory_budget_bytes)
                       + (self.weights_bytes() if self.device.type != "cpu" else 0),
                       weights_bytes=self.weights_bytes())
        cap = self.config.max_num_seqs * -(-self.config.max_model_len // self.config.block_size)
        if est.num_blocks < 1:
            raise ValueError(f"no memory left for the KV cache on {self.device} after {self.weights_bytes() / 2**30:.2f} "
                             f"GiB of weights; raise gpu_memory_utilization or pass num_blocks")
        return min(est.num_blocks, cap)

    # ---- turning tokens into results --------------------------------------------------------------------
    def _advance(self, seq, token: int, logprobs: dict | None) -> StreamEvent:
        """Record a sampled token: publish a newly full block, check stop conditions, compute the text delta."""
        bs = self.config.block_size
        seq.num_computed = len(seq)
        if seq.num_computed % bs == 0:  # the block just completed becomes reusable by later requests
            extend_keys(seq, bs, self.config.cache_strategy, self.model_id, self.dtype_name)
            self.block_manager.register(seq, seq.num_computed // bs - 1)
        seq.append_token(token)
        if logprobs is not None:
            seq.logprobs.append(logprobs)
        p, reason = seq.params, None
        if not p.ignore_eos and token in self.eos_ids:
            reason = "stop"
        elif seq.num_output_tokens >= p.max_tokens or len(seq) >= self.config.max_model_len:
            reason = "length"
        text = self.tokenizer.decode(seq.output_ids, skip_special_tokens=True)
        for s in p.stop or []:
            if s and s in text:
                text, reason = text[:text.index(s)], "stop"
        seq.text = text
        ready = len(text) if reason or not text.endswith("\ufffd") else len(text) - 1  # hold partial UTF-8
        delta = text[seq.sent_text_len:ready]
        seq.sent_text_len = max(seq.sent_text_len, ready)
        ev = StreamEvent(seq.request_id, delta, text[:seq.sent_text_len], False, None)
        if reason:
            ev.output, ev.finished = self._finish(seq, reason), True
        return ev

    def _finish(self, seq, reason: str) -> Output:
        self.scheduler.finish(seq)
        seq.finish_reason = reason
        out = Output(seq.request_id, seq.text, seq.output_ids, reason, seq.num_prompt_tokens, seq.num_cached_tokens,
                     list(seq.cache_hits), seq.logprobs, [n for im in seq.images for n in im.notes])
        self._retire(seq, StreamEvent(seq.request_id, "", seq.text, True, None, out) if reason == "abort" else None)
        return out

    def _fail(self, seq, error: Exception):
        self.scheduler.finish(seq)
        self._retire(seq, error)

    def _retire(self, seq, final):
        """Subclasses drop the request's bookkeeping and hand `final` (event or error) to its caller."""

    # ---- views ------------------------------------------------------------------------------------------
    def snapshot(self):
        """KVSnapshot of the pool now (plain data, safe to hand to another thread)."""
        with self._lock:
            return self.snapshots.build(list(self.scheduler.running), list(self.scheduler.waiting),
                                        self.step_count, self.scheduler.num_preemptions)

    def memory_report(self) -> MemoryReport:
        """What is really allocated: weights, the KV pool, and the device's peak where it can tell."""
        kv = self.kv_cache.numel() * self.kv_cache.element_size()
        tokens = self.num_blocks * self.config.block_size
        return MemoryReport(self.weights_bytes(), kv, self.kv_bytes_per_token, self.num_blocks, self.config.block_size,
                            peak_bytes(self.device), str(self.device), self.dtype_name, self.vision.num_bytes(),
                            tokens, tokens / self.config.max_model_len)

    def reset_prefix_cache(self):
        """Forget every cached-but-free block and every cached vision embedding."""
        with self._lock:
            self.block_manager.reset()
            self.vision_cache.clear()
