"""The engine's linear layer. On x86-64 CPUs, fp32 inference goes through oneDNN with weights prepacked in its
blocked layout: PyTorch's default fp32 CPU GEMM (MKL) takes a slower path on some CPUs (2-3x slower on one AMD
EPYC, 10-20 % on another), and prepacked weights stream faster in memory-bound decode. Decode of one to a few
sequences is a matrix-vector product, where oneDNN reads weights at 60 % of the copy bandwidth: the decoder keeps
a dense copy for gemv.c (90 %) while that copy costs at most DENSE_COPY_LIMIT. Everywhere else (other CPUs, other
dtypes, CUDA, MPS, training) it is plain nn.Linear."""
import platform

import torch
from torch import nn

from minivlm.model import gemv

# measured on x86-64 only, so other CPUs (e.g. Apple silicon) keep plain nn.Linear
ONEDNN = torch.backends.mkldnn.is_available() and platform.machine().lower() in ("x86_64", "amd64")
DENSE_COPY_LIMIT = 2**30  # bytes of dense weight copies the decoder may keep beside the packed ones


def packs(device, dtype) -> bool:
    """Whether weights on this device and dtype are worth prepacking for oneDNN."""
    return ONEDNN and torch.device(device).type == "cpu" and dtype == torch.float32


class FastLinear(nn.Linear):
    """nn.Linear whose fp32 CPU inference runs oneDNN (prepacked weights after pack()), and gemv.c for inputs of at
    most gemv.MAX_ROWS rows where a dense weight is at hand (the weight itself, or a `dense` copy kept by pack)."""

    def pack(self, keep_dense: bool = False):
        """Store the weight in oneDNN's blocked layout: the same numbers (lossless, the same bytes), laid out in
        the order its kernel reads them; keep_dense keeps the plain layout too."""
        w = self.weight.detach()
        if keep_dense:
            self.register_buffer("dense", w.contiguous(), persistent=False)
        self.weight = nn.Parameter(torch.ops.mkldnn._reorder_linear_weight(w), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dense = getattr(self, "dense", None) if self.weight.is_mkldnn else self.weight
        if dense is not None and x.numel() <= gemv.MAX_ROWS * x.shape[-1] and ONEDNN and x.is_cpu and \
                x.dtype == dense.dtype == torch.float32 and dense.is_contiguous() and not torch.is_grad_enabled() \
                and gemv.available():
            return gemv.linear(x, dense, self.bias)
        if self.weight.is_mkldnn or (ONEDNN and x.is_cpu and x.dtype == torch.float32 and not torch.is_grad_enabled()):
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return super().forward(x)


def use_fast_linears(module: nn.Module, device, dtype, small_batches: bool = False) -> nn.Module:
    """Turn every nn.Linear of a loaded module into a FastLinear (same parameters), prepacked where it pays off;
    weights shared with an embedding table stay dense, since lookups read them too. small_batches (the decoder):
    also keep dense copies for gemv.c, if they fit DENSE_COPY_LIMIT."""
    shared = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    linears = [m for m in module.modules() if type(m) in (nn.Linear, FastLinear)]
    packed = [m for m in linears if packs(device, dtype) and id(m.weight) not in shared and not m.weight.is_mkldnn]
    copies = sum(m.weight.numel() * m.weight.element_size() for m in packed)
    keep_dense = small_batches and copies <= DENSE_COPY_LIMIT and gemv.available()
    for m in linears:
        m.__class__ = FastLinear
    for m in packed:
        m.pack(keep_dense)
    return module


def linear_backend(module: nn.Module) -> str:
    """Which matrix products a loaded decoder runs, in words (the status line)."""
    layers = [m for m in module.modules() if isinstance(m, FastLinear)]
    if not any(m.weight.is_mkldnn for m in layers):
        return "PyTorch's default (nn.Linear)"
    if any(getattr(m, "dense", None) is not None for m in layers) and gemv.available():
        return f"gemv.c for decode batches of 1-{gemv.MAX_ROWS}, oneDNN (prepacked) above"
    why = gemv.error or f"dense copies would exceed {DENSE_COPY_LIMIT >> 30} GiB"
    return f"oneDNN (prepacked); gemv.c off: {why}"
