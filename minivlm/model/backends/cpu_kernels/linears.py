"""The CPU fp32 linear backend. On x86-64 CPUs, fp32 inference goes through oneDNN with weights prepacked in its
blocked layout: PyTorch's default fp32 CPU GEMM (MKL) takes a slower path on some CPUs (2-3x slower on one AMD
EPYC, 10-20 % on another), and prepacked weights stream faster in memory-bound decode. Decode of one to a few
sequences is a matrix-vector product, where oneDNN reads weights at 60 % of the copy bandwidth: the decoder keeps
a dense copy for gemv.c (90 %) while that copy costs at most DENSE_COPY_LIMIT. Everywhere else (other CPUs, other
dtypes, CUDA, MPS) the model keeps plain nn.Linear (backends.prepare_linears decides, once, at load)."""
import platform

import torch
import torch.nn.functional as F
from torch import nn

from minivlm.model.backends.cpu_kernels import gemv

# measured on x86-64 only, so other CPUs (e.g. Apple silicon) keep plain nn.Linear
ONEDNN = torch.backends.mkldnn.is_available() and platform.machine().lower() in ("x86_64", "amd64")
DENSE_COPY_LIMIT = 2**30  # bytes of dense weight copies the decoder may keep beside the packed ones


class FastLinear(nn.Linear):
    """nn.Linear whose fp32 CPU inference runs oneDNN (prepacked weights after pack()), and gemv.c for inputs of at
    most `small_rows` rows where a dense weight is at hand (the weight itself, or a `dense` copy kept by pack)."""
    small_rows = 0  # gemv.MAX_ROWS where prepare() found gemv.c built
    plain = False   # PyTorch's own F.linear (MKL) on the dense weight: where a calibration found it faster

    def pack(self, keep_dense: bool = False):
        """Store the weight in oneDNN's blocked layout: the same numbers (lossless, the same bytes), laid out in
        the order its kernel reads them; keep_dense keeps the plain layout too."""
        w = self.weight.detach()
        if keep_dense:
            self.register_buffer("dense", w.contiguous(), persistent=False)
        self.weight = nn.Parameter(torch.ops.mkldnn._reorder_linear_weight(w), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dense = getattr(self, "dense", None) if self.weight.is_mkldnn else self.weight
        if self.plain:
            return F.linear(x, dense, self.bias)
        if dense is not None and x.numel() <= self.small_rows * x.shape[-1] and x.is_cpu and \
                x.dtype == dense.dtype == torch.float32 and dense.is_contiguous() and not torch.is_grad_enabled():
            return gemv.linear(x, dense, self.bias)
        if self.weight.is_mkldnn or (x.is_cpu and x.dtype == torch.float32 and not torch.is_grad_enabled()):
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return super().forward(x)


_SUBCLASSES: dict[type, type] = {}


def fast_class(cls: type) -> type:
    """FastLinear for nn.Linear; for a subclass of it (vision.PatchProjection), that class over FastLinear under the
    same name, so its own forward's super() reaches FastLinear's."""
    if issubclass(cls, FastLinear):
        return cls
    if cls is nn.Linear:
        return FastLinear
    return _SUBCLASSES.setdefault(cls, type(cls.__name__, (cls, FastLinear), {}))


def prepare(module: nn.Module, small_batches: bool = False, gemv_why: str | None = None) -> str | None:
    """Turn every nn.Linear of a loaded module into a FastLinear (same parameters), plain ones prepacked; weights
    shared with an embedding table stay dense, since lookups read them too. small_batches (the decoder): also keep
    dense copies for gemv.c, if they fit DENSE_COPY_LIMIT. gemv_why: why gemv.c is off (None: it is built).
    Returns None if small batches of the packed layers run gemv.c, else why not."""
    shared = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    packed = [m for m in linears if type(m) in (nn.Linear, FastLinear) and id(m.weight) not in shared
              and not m.weight.is_mkldnn]
    copies = sum(m.weight.numel() * m.weight.element_size() for m in packed)
    for m in linears:
        m.__class__ = fast_class(type(m))
        m.small_rows = gemv.MAX_ROWS if gemv_why is None else 0
    if gemv_why is None and copies > DENSE_COPY_LIMIT:
        gemv_why = f"dense copies would exceed {DENSE_COPY_LIMIT >> 30} GiB"
    for m in packed:
        m.pack(keep_dense=small_batches and gemv_why is None)
    return gemv_why


def plain_ready(module: nn.Module) -> bool:
    """Whether every FastLinear of module has a dense weight at hand for plain F.linear (gemv.c's copies kept)."""
    fast = [m for m in module.modules() if isinstance(m, FastLinear)]
    return bool(fast) and all(not m.weight.is_mkldnn or getattr(m, "dense", None) is not None for m in fast)


def set_plain(module: nn.Module, on: bool, free_packed: bool = False):
    """Run module's FastLinears as plain F.linear (on) or as prepared; free_packed: for good, the dense weight
    becomes the weight and the packed copy is freed."""
    for m in module.modules():
        if isinstance(m, FastLinear):
            m.plain = on
            if free_packed and m.weight.is_mkldnn:
                m.weight = nn.Parameter(m.dense, requires_grad=False)
                del m.dense
