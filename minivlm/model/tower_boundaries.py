"""Points inside a vision tower's forward where a thread may pause it (the engine's sliced tower: tower_slices.py).
Every module's forward starts at one (a pre-hook), and so does every attention call and every QUERY_ROWS query
rows of a long one: attention is the one piece of a ViT block without a module of its own, and a 448x448 image's
full-attention layer alone is a quarter of the tower. On a thread that set no pause function they do nothing,
and attention runs as transformers' SDPA in one call."""
import threading
from contextlib import contextmanager

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ATTN_IMPLEMENTATION = "minivlm_sliced_sdpa"  # the towers' attention: transformers' SDPA, pausable between query rows
QUERY_ROWS = 256  # query rows a slice of one attention call computes (each attends to all keys: the same result)

_thread = threading.local()


@contextmanager
def pausable(pause):
    """On this thread, call pause() at every boundary of the towers it runs (pause may block, or raise to stop)."""
    _thread.pause = pause
    try:
        yield
    finally:
        _thread.pause = None


def boundary(*_):
    pause = getattr(_thread, "pause", None)
    if pause is not None:
        pause()


def add_boundaries(module: nn.Module):
    """A boundary at the start of every submodule's forward."""
    for m in module.modules():
        m.register_forward_pre_hook(boundary)


def sliced_sdpa(module, query, key, value, attention_mask, *args, **kwargs):
    """transformers' SDPA attention ([batch, heads, rows, dim] in, [batch, rows, heads, dim] out); on a pausable
    thread a long non-causal one runs QUERY_ROWS query rows at a time, a boundary before each."""
    causal = args[2] if len(args) > 2 else kwargs.get("is_causal")  # (dropout, scaling, is_causal, ...)
    causal = getattr(module, "is_causal", True) if causal is None else causal  # as transformers resolves it
    rows = query.shape[2]
    if getattr(_thread, "pause", None) is None or causal or rows <= QUERY_ROWS:
        boundary()
        return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    outs = []
    for a in range(0, rows, QUERY_ROWS):
        boundary()
        mask = attention_mask if attention_mask is None or attention_mask.shape[-2] == 1 else \
            attention_mask[..., a:a + QUERY_ROWS, :]
        outs.append(sdpa_attention_forward(module, query[:, :, a:a + QUERY_ROWS], key, value, mask, *args, **kwargs)[0])
    return torch.cat(outs, dim=1), None


AttentionInterface.register(ATTN_IMPLEMENTATION, sliced_sdpa)
