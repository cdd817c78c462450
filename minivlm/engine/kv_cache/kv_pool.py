"""The paged KV pool: how many blocks fit the memory budget, the one tensor that holds them, what it costs."""
import logging

import torch

from minivlm.config import EngineConfig
from minivlm.device import free_memory_bytes, peak_bytes
from minivlm.loader import LoadedModel
from minivlm.engine.outputs import MemoryReport
from minivlm.model.cache_spec import engine_specs, group_layers

log = logging.getLogger("minivlm")


def budget_estimate(config: EngineConfig, model: LoadedModel):
    """minivlm.budget's plan for this engine: the memory budget after weights and activations, split into KV blocks
    (and, for a hybrid model, into its KV-cache groups: est.kv_groups)."""
    from minivlm.budget import estimate
    device, weights = model.device, model.weights_bytes()
    return estimate(model.hf_config, dtype=model.dtype_name, kv_dtype=model.dtype_name,
                    max_model_len=config.max_model_len, num_seqs=config.max_num_seqs,
                    max_num_batched_tokens=config.max_num_batched_tokens, block_size=config.block_size,
                    gpu_memory_utilization=1.0 if device.type == "cpu" else config.gpu_memory_utilization,
                    device_memory_bytes=free_memory_bytes(device, config.cpu_memory_budget_bytes)
                    + (weights if device.type != "cpu" else 0), weights_bytes=weights,  # CPU: a budget already
                    enable_chunked_prefill=config.enable_chunked_prefill, state_checkpoints=config.state_checkpoints,
                    speculative_config=config.speculative_config)  # method "mtp": the head's weights and K/V too


def no_room(device, weights: int) -> ValueError:
    return ValueError(f"no memory left for the KV cache on {device} after {weights / 2**30:.2f} GiB of weights; "
                      f"raise gpu_memory_utilization or pass num_blocks")


def derive_num_blocks(config: EngineConfig, model: LoadedModel) -> int:
    """KV blocks that fit the memory budget (the same formula as minivlm.budget), capped at what
    max_num_seqs requests of max_model_len tokens could ever use."""
    est = budget_estimate(config, model)
    if est.num_blocks < 1:
        raise no_room(model.device, model.weights_bytes())
    return min(est.num_blocks, config.max_num_seqs * -(-config.max_model_len // config.block_size))


def led_groups(layers: dict[str, list[int]]) -> dict[str, list[int]]:
    """The groups, if one of them can lead the coordinator (coordinator.py: the full-attention group offers every prefix
    hit and backs the block map); a decoder without a full-attention layer is refused by name."""
    if "full_attention" not in layers:
        kinds = ", ".join(f"{kind} (layers {idx})" for kind, idx in layers.items())
        raise ValueError(f"no full-attention layer among {kinds}: the engine's KV cache needs one full-attention group "
                         f"to lead its prefix cache and block map")
    return layers


class KVPool:
    """kv_cache[0 | 1, layer] is layer's K | V cache, shaped [num_blocks, block_size, kv_heads, head_dim]. A hybrid
    model (its decoder lists layer_specs) gets one pool per KV-cache group (engine/kv_cache/coordinator.py): `kv_cache` is then
    the full-attention group's, and `layer_caches[i]` is what layer i reads and writes, whatever its group."""

    def __init__(self, config: EngineConfig, model: LoadedModel):
        self.config, self.model = config, model
        text_cfg = model.text_config
        self.specs = engine_specs(model.decoder, config.speculative_config)  # an MTP head's layers only when drafting
        self.groups: dict[str, GroupPool] = {}
        self.checkpoints = 0
        if self.specs is not None:
            self._build_groups()
        else:
            layers, heads, dim = text_cfg.num_hidden_layers, text_cfg.num_key_value_heads, text_cfg.head_dim
            self.kv_bytes_per_token = 2 * layers * heads * dim * model.dtype.itemsize
            self.num_blocks = config.num_blocks or derive_num_blocks(config, model)
            self.kv_cache = torch.zeros(2, layers, self.num_blocks, config.block_size, heads, dim,
                                        dtype=model.dtype, device=model.device)
            self.layer_caches = [(self.kv_cache[0, i], self.kv_cache[1, i]) for i in range(layers)]
        tokens = self.num_blocks * config.block_size
        groups = "".join(f" | {g.kind} (layers {len(g.layers)}{f', window {g.window}' if g.window else ''}): {g.size} "
                         f"{'slots' if g.kind == 'recurrent' else 'blocks'}" for g in self.groups.values())
        log.info("minivlm: %s on %s (%s) | KV cache: %d blocks x %d = %d tokens | max concurrency %.2fx at %d tokens%s",
                 model.model_type, model.device, model.dtype_name, self.num_blocks, config.block_size, tokens,
                 self.max_concurrency if self.groups else tokens / config.max_model_len, config.max_model_len, groups)

    def _build_groups(self):
        """One tensor per group: attention groups [2, layers, blocks, block_size, kv_heads, head_dim], the recurrent
        group one [layers, slots, *shape] per state tensor; sized by minivlm.budget.kv_groups."""
        config, model = self.config, self.model
        layers = led_groups(group_layers(self.specs))  # full attention first; two windows of one kind are refused
        first = {kind: self.specs[idx[0]] for kind, idx in layers.items()}
        sizes = self._sizes()
        self.checkpoints = sizes.checkpoints  # of the recurrent group's slots, those beyond one per running request
        self.layer_caches = [None] * len(self.specs)
        for kind, idx in layers.items():
            if kind == "kv_shared":  # last in group order: its layers read their sources' tensors, allocate none
                self.groups[kind] = SharedGroupPool(idx, [self.specs[i].source for i in idx], self.groups)
                for i in idx:
                    self.layer_caches[i] = self.layer_caches[self.specs[i].source]
                continue
            spec, size = first[kind], sizes.group(kind)
            n = size.slots if kind == "recurrent" else size.blocks
            if kind == "recurrent":
                tensors = [torch.zeros(len(idx), n, *shape, dtype=spec.state_dtype or model.dtype, device=model.device)
                           for shape in spec.state_shapes]
                for j, i in enumerate(idx):
                    self.layer_caches[i] = tuple(t[j] for t in tensors)
            else:
                kv = torch.zeros(2, len(idx), n, config.block_size, spec.kv_heads, spec.head_dim, dtype=model.dtype,
                                 device=model.device)
                tensors = [kv]
                for j, i in enumerate(idx):
                    self.layer_caches[i] = (kv[0, j], kv[1, j])
            self.groups[kind] = GroupPool(kind, idx, spec.window, n, tensors)
        full = self.groups["full_attention"]
        self.kv_cache, self.num_blocks = full.tensors[0], full.size
        self.kv_bytes_per_token = sum(first[k].bytes_per_token(model.dtype) * len(layers[k])
                                      for k in ("full_attention",) if k in layers)
        self.max_concurrency = sizes.max_concurrency

    def _sizes(self):
        """Blocks or slots per group (budget/kv_groups.py's rule, the VRAM calculator's too): num_blocks pins the
        full-attention group, else the memory budget sizes every group."""
        from minivlm.budget.kv_groups import groups_from_specs, size_groups
        c, m = self.config, self.model
        if not c.num_blocks:
            sizes = budget_estimate(c, m).kv_groups
            if sizes.full_blocks < 1:
                raise no_room(m.device, m.weights_bytes())
            return sizes
        return size_groups(groups_from_specs(self.specs), m.dtype_name, None, c.block_size, c.max_num_seqs,
                           c.max_num_batched_tokens, c.enable_chunked_prefill, c.max_model_len, c.state_checkpoints,
                           num_blocks=c.num_blocks)

    def memory_report(self) -> MemoryReport:
        """What is allocated now: weights, the pool (0 once released), and the device's peak where it can tell."""
        kv = self.kv_cache.nbytes if self.kv_cache is not None else 0
        if self.groups and self.kv_cache is not None:
            kv = sum(t.nbytes for g in self.groups.values() for t in g.tensors)
        tokens = self.num_blocks * self.config.block_size
        concurrency = self.max_concurrency if self.groups else tokens / self.config.max_model_len
        return MemoryReport(self.model.weights_bytes(), kv, self.kv_bytes_per_token, self.num_blocks,
                            self.config.block_size, peak_bytes(self.model.device), str(self.model.device),
                            self.model.dtype_name, self.model.vision.num_bytes() if self.model.vision else 0, tokens,
                            concurrency, self.model.weight_copies_bytes(),
                            [g.report() for g in self.groups.values()], *self._checkpoints())

    def _checkpoints(self) -> tuple[int, int]:
        """(slots, bytes) of the recurrent group's checkpoints: its bytes per slot times the slots beyond running."""
        states = self.groups.get("recurrent")
        if states is None or not states.size or not states.tensors:
            return (self.checkpoints if states else 0), 0
        return self.checkpoints, self.checkpoints * sum(t.nbytes for t in states.tensors) // states.size

    def release(self):
        self.kv_cache = None
        self.layer_caches = None
        for g in self.groups.values():
            g.tensors = []


class GroupPool:
    """One KV-cache group's memory: its layers, its size (blocks or state slots), its tensors."""

    def __init__(self, kind: str, layers: list[int], window: int | None, size: int, tensors: list[torch.Tensor]):
        self.kind, self.layers, self.window, self.size, self.tensors = kind, layers, window, size, tensors

    def report(self) -> dict:
        return {"name": self.kind, "kind": self.kind, "layers": list(self.layers), "window": self.window,
                "size": self.size, "unit": "slots" if self.kind == "recurrent" else "blocks",
                "bytes": sum(t.nbytes for t in self.tensors)}


class SharedGroupPool(GroupPool):
    """The kv_shared group's memory: none. Its layers read the tensors of their source layers' groups."""

    def __init__(self, layers: list[int], sources: list[int], groups: dict):
        super().__init__("kv_shared", layers, None, 0, [])
        self.sources = dict(zip(layers, sources))  # each layer -> the layer whose K/V it reads
        ids = {i: g for g, pool in enumerate(groups.values()) for i in pool.layers}
        self.reads = tuple(sorted({ids[s] for s in sources}))  # the group ids it reads

    def report(self) -> dict:
        return {**super().report(), "reads": dict(self.sources), "reads_groups": list(self.reads)}
