"""The decoder layer's small ops fused for the CPU in fp32 (decode_ops.c, called through ctypes): the residual add
with RMSNorm, q/k norm + RoPE + the K/V write into the pool, and SiLU-and-multiply. A decode step of one sequence
was about 400 PyTorch ops besides its matrix products, each paying dispatch; these are 3 calls a layer instead of
about 15 ops. The CPU backend (cpu_kernels/__init__.py) runs a layer with them; tests/test_decode_ops.py checks each
against the PyTorch arithmetic of the reference decoder (model/decoder.py)."""
import ctypes
import os

import torch

from minivlm.model.backends.cpu_kernels.c_build import LazyKernels

_p, _i, _f = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
KERNELS = LazyKernels(os.path.join(os.path.dirname(os.path.abspath(__file__)), "decode_ops.c"), {
    "rms_norm_f32": [_p, _p, _p, _p, _i, _i, _f, ctypes.c_int],
    "rope_store_f32": [_p, _p, _p, _p, _p, _f, _p, _p, _p, _i, _i, _i, _i, ctypes.c_int],
    "silu_mul_f32": [_p, _p, _i, _i, ctypes.c_int]})


def _ptr(t: torch.Tensor | None):
    return None if t is None else t.data_ptr()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, delta: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of x's rows; with delta, x += delta first, in place (the residual stream), and x is the sum after."""
    n = x.shape[-1]
    assert x.is_contiguous() and (delta is None or delta.is_contiguous()) and weight.is_contiguous()
    out = torch.empty_like(x)
    KERNELS.get().rms_norm_f32(x.data_ptr(), _ptr(delta), weight.data_ptr(), out.data_ptr(), x.numel() // n, n, eps,
                               torch.get_num_threads())
    return out


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, k_cache: torch.Tensor,
               v_cache: torch.Tensor, slots: torch.Tensor, q_norm: torch.Tensor | None = None,
               k_norm: torch.Tensor | None = None, eps: float = 0.0):
    """In place on qkv [T, heads + 2 kv_heads, d]: q and k normalised (if given) and rotated; then k and v written
    into the pool [blocks, block_size, kv_heads, d] at slots [T]. cos/sin hold T rows of d."""
    rows, width, d = qkv.shape
    kv_heads = (width - heads) // 2
    assert qkv.is_contiguous() and cos.is_contiguous() and sin.is_contiguous() and cos.numel() == rows * d
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.shape[2:] == (kv_heads, d)
    slots = slots.to(torch.int64).contiguous()
    KERNELS.get().rope_store_f32(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), _ptr(q_norm), _ptr(k_norm), eps,
                                 k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(), rows, heads, kv_heads, d,
                                 torch.get_num_threads())


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate_up [..., 2n] = [gate | up] -> [..., n]."""
    n = gate_up.shape[-1] // 2
    assert gate_up.is_contiguous()
    out = gate_up.new_empty(*gate_up.shape[:-1], n)
    KERNELS.get().silu_mul_f32(gate_up.data_ptr(), out.data_ptr(), gate_up.numel() // (2 * n), n,
                               torch.get_num_threads())
    return out
