"""The engine's linear layer. On x86-64 CPUs, fp32 inference goes through oneDNN with weights prepacked in its
blocked layout: PyTorch's default fp32 CPU GEMM (MKL) takes a slower path on some CPUs (2-3x slower on one AMD
EPYC, 10-20 % on another), and prepacked weights stream faster in memory-bound decode. Everywhere else
(other CPUs, other dtypes, CUDA, MPS, training) it is plain nn.Linear."""
import platform

import torch
from torch import nn

# measured on x86-64 only, so other CPUs (e.g. Apple silicon) keep plain nn.Linear
ONEDNN = torch.backends.mkldnn.is_available() and platform.machine().lower() in ("x86_64", "amd64")


def packs(device, dtype) -> bool:
    """Whether weights on this device and dtype are worth prepacking for oneDNN."""
    return ONEDNN and torch.device(device).type == "cpu" and dtype == torch.float32


class FastLinear(nn.Linear):
    """nn.Linear whose fp32 CPU inference runs oneDNN (prepacked weights after pack())."""

    def pack(self):
        """Store the weight in oneDNN's blocked layout: the same numbers (lossless, the same bytes), laid out in
        the order its kernel reads them."""
        self.weight = nn.Parameter(torch.ops.mkldnn._reorder_linear_weight(self.weight.detach()), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.is_mkldnn or (ONEDNN and x.is_cpu and x.dtype == torch.float32 and not torch.is_grad_enabled()):
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return super().forward(x)


def use_fast_linears(module: nn.Module, device, dtype) -> nn.Module:
    """Turn every nn.Linear of a loaded module into a FastLinear (same parameters), prepacked where it pays off;
    weights shared with an embedding table stay dense, since lookups read them too."""
    shared = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    for m in module.modules():
        if type(m) in (nn.Linear, FastLinear):
            m.__class__ = FastLinear
            if packs(device, dtype) and id(m.weight) not in shared and not m.weight.is_mkldnn:
                m.pack()
    return module
