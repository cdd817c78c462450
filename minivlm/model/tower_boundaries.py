"""Points inside a vision tower's forward where a thread may pause it (the engine's sliced tower: tower_slices.py).
Every module's forward starts at one (a pre-hook), and so does every attention call and every QUERY_ROWS query
rows of a long one (attention is the one piece of a ViT block without a module of its own, and a 448x448 image's
full-attention layer alone is a quarter of the tower), and on the CPU every QUERY_ROWS input rows of a linear
layer (a 448x448 image's qkv product took 4.4 ms whole on 2 cores, more than a step usually leaves the tower).
On a thread that set no pause function they do nothing, and attention runs as transformers' SDPA in one call.
Each boundary names the work that follows it (the module's kind and weight shapes, its input's shape): every
block of a tower repeats the same units, so what a unit took the last time is what it will take now."""
import threading
import weakref
from contextlib import contextmanager
from functools import partial

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ATTN_IMPLEMENTATION = "minivlm_sliced_sdpa"  # the towers' attention: transformers' SDPA, pausable between query rows
QUERY_ROWS = 128  # rows a slice of an attention call or a linear layer computes (each row on its own: the same result)

_thread = threading.local()


@contextmanager
def pausable(pause):
    """On this thread, call pause(unit) at every boundary of the towers it runs (pause may block, or raise to stop);
    unit: a hashable name of the work up to the next boundary."""
    _thread.pause = pause
    try:
        yield
    finally:
        _thread.pause = None


def boundary(unit=None):
    pause = getattr(_thread, "pause", None)
    if pause is not None:
        pause(unit)


def _module_boundary(kind: tuple, _module, args):
    if getattr(_thread, "pause", None) is not None:
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        boundary((kind, None if first is None else tuple(first.shape)))


def _linear_in_rows(kind: tuple, ref: weakref.ref, x: torch.Tensor) -> torch.Tensor:
    """A linear layer's forward; on a pausable thread, QUERY_ROWS rows of its input at a time (each output row is
    its own input row's product: the same numbers), a boundary between them. ref: the layer, weakly (a layer that
    held itself would be a cycle, and an engine's frozen cycles are never collected)."""
    module = ref()
    forward = type(module).forward  # the class's, looked up now (the linear backend changes the class later)
    if getattr(_thread, "pause", None) is None or x.dim() < 2 or x.device.type != "cpu":  # a GPU's units are short,
        return forward(module, x)                                                        # and each stop syncs it
    rows_of_features = x.shape[-1] == module.in_features  # else a layer that reshapes its own input (the patch
    flat = x.reshape(-1, x.shape[-1]) if rows_of_features else x  # projection): the items of its first dim
    if flat.shape[0] <= QUERY_ROWS:
        return forward(module, x)
    outs = []
    for a in range(0, flat.shape[0], QUERY_ROWS):
        if a:  # the module's own boundary came just before the first rows
            boundary((kind, "rows", min(QUERY_ROWS, flat.shape[0] - a)))
        outs.append(forward(module, flat[a:a + QUERY_ROWS]))
    out = torch.cat(outs)
    return out.reshape(*x.shape[:-1], -1) if rows_of_features else out


def add_boundaries(module: nn.Module):
    """A boundary at the start of every submodule's forward, named by the module's kind and its weights' shapes,
    and between row slices of every linear layer."""
    for m in module.modules():
        kind = (type(m).__name__, tuple(tuple(p.shape) for p in m.parameters(recurse=False)))
        m.register_forward_pre_hook(partial(_module_boundary, kind))
        if isinstance(m, nn.Linear):
            m.forward = partial(_linear_in_rows, kind, weakref.ref(m))


def sliced_sdpa(module, query, key, value, attention_mask, *args, **kwargs):
    """transformers' SDPA attention ([batch, heads, rows, dim] in, [batch, rows, heads, dim] out); on a pausable
    thread a long non-causal one runs QUERY_ROWS query rows at a time, a boundary before each."""
    causal = args[2] if len(args) > 2 else kwargs.get("is_causal")  # (dropout, scaling, is_causal, ...)
    causal = getattr(module, "is_causal", True) if causal is None else causal  # as transformers resolves it
    rows = query.shape[2]
    if getattr(_thread, "pause", None) is None or causal or rows <= QUERY_ROWS:
        boundary(("attention", tuple(query.shape), tuple(key.shape)))
        return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    outs = []
    for a in range(0, rows, QUERY_ROWS):
        boundary(("attention rows", min(QUERY_ROWS, rows - a), tuple(query.shape[:2]), tuple(key.shape)))
        mask = attention_mask if attention_mask is None or attention_mask.shape[-2] == 1 else \
            attention_mask[..., a:a + QUERY_ROWS, :]
        outs.append(sdpa_attention_forward(module, query[:, :, a:a + QUERY_ROWS], key, value, mask, *args, **kwargs)[0])
    return torch.cat(outs, dim=1), None


AttentionInterface.register(ATTN_IMPLEMENTATION, sliced_sdpa)
