"""Weight-only quantization (vLLM's `quantization="int8"` / `"int4"`) through PyTorch's own CPU kernels: decode reads
every weight once per token, so weights 4x (int8) or 8x (int4) smaller than fp32 are fewer bytes to read and a
model that did not fit in memory does. The decoder's linear layers are quantized at load, and the lm_head in int8
with either method (as llama.cpp's Q8_0 does, and Q4_K_M keeps it at 6 bits): a decode step reads it whole, and in
fp32 a 151,936-token vocabulary's lm_head (Qwen's, tied at 2B) is 1.2 GB a token beside 1.4 GB of int8 layers. The
embeddings (a row read a token; a tied lm_head's int8 copy is its own) and the vision tower keep their dtype.
Activations stay in the engine's dtype, except that each product takes its input in bf16: PyTorch's int8 kernel ran
2.8x slower with fp32 inputs (bench/RESULTS.md, session 16), and its int4 kernel takes no other. In an fp32 engine
the layers' small ops then run the fused C kernels around these products (decode_ops.c; attention over the pool in
place), which PyTorch's ops cost more than the products here.

    int8  symmetric, one scale per output channel (max |w| / 127), scales in bf16;
          torch.ops.aten._weight_int8pack_mm, or for decode steps the C kernels over int8 weights (decode_layer_int8.c
          in one call, gemv_int8.c layer by layer) where the load's calibration finds them faster; on x86 with AVX2
          they multiply by the inputs quantized to int8 in blocks of 32 (q8_activations.h, llama.cpp's Q8_0 way):
          two threads read 21.5 GB/s of the 348M bench model's weights, where widening each weight to a float read
          15.4 and PyTorch's kernel 13.4
    int4  asymmetric, one scale and zero point per group of GROUP input channels; PyTorch's packed layout,
          torch.ops.aten._weight_int4pack_mm_for_cpu

Both are the CPU's: on CUDA and MPS the option is refused (PyTorch ships no weight-only int8 CUDA matmul of this
form; bitsandbytes / torchao would be the way there)."""
import torch
from torch import nn

from minivlm.model.backends.cpu_kernels import gemv_int8

METHODS = ("int8", "int4")
GROUP = 128  # int4 group size (input channels per scale / zero point): PyTorch's kernel takes 32, 64, 128 or 256


class Int8Linear(nn.Module):
    """y = x @ (q * scale).T + b, with q int8 [out, in] and one scale per output row. fp32 inputs of at most
    `small_rows` rows run gemv_int8.c (a decode step; the calibration at load sets it where that is faster), the
    rest PyTorch's kernel, which takes x in bf16."""
    small_rows = 0

    def __init__(self, linear: nn.Linear, dtype: torch.dtype):
        super().__init__()
        w = linear.weight.detach().float()
        scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).to(torch.bfloat16)  # rounded first: q is against it
        self.register_buffer("qweight", torch.round(w / scale.float()[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scale)
        self.register_buffer("scales_f32", scale.float(), persistent=False)  # the same numbers, for gemv_int8.c
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and x.numel() <= self.small_rows * self.in_features:
            return gemv_int8.linear(x, self.qweight, self.scales_f32, self.bias)
        y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous(),
                                               self.qweight, self.scales)
        y = y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        return y + self.bias if self.bias is not None else y

    def dequantized(self) -> torch.Tensor:
        return self.qweight.float() * self.scales.float()[:, None]


class Int4Linear(nn.Module):
    """Group-wise int4: w ≈ (q - 8) · scale + zero per group of GROUP input channels, q in [0, 15]."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype):
        super().__init__()
        w = linear.weight.detach().float()
        out, inp = w.shape
        if inp % GROUP:
            raise ValueError(f"quantization='int4': a layer's {inp} input channels are not a multiple of {GROUP}")
        g = w.reshape(out, inp // GROUP, GROUP)
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        scale = ((hi - lo) / 15).clamp(min=1e-12)
        q = torch.round((g - lo) / scale).clamp(0, 15).to(torch.int32).reshape(out, inp)
        zero = lo + 8 * scale  # the kernel computes (q - 8) * scale + zero
        self.register_buffer("qweight", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
        self.register_buffer("scales_zeros", torch.stack([scale[..., 0], zero[..., 0]], -1).transpose(0, 1)
                             .contiguous().to(torch.bfloat16))  # [in / GROUP, out, 2]
        self.bias = linear.bias
        self.in_features, self.out_features = inp, out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous(),
                                                       self.qweight, GROUP, self.scales_zeros)
        y = y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        return y + self.bias if self.bias is not None else y

    def dequantized(self) -> torch.Tensor:
        """The weight the kernel multiplies by, recovered by multiplying the identity (the layout is PyTorch's)."""
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.qweight, GROUP, self.scales_zeros).float().t()


def quantize(decoder: nn.Module, method: str, device, dtype: torch.dtype) -> int:
    """Replace the decoder layers' nn.Linear by their quantized form and the lm_head by an int8 one, in place;
    returns how many. The embeddings keep the engine's dtype (a tied lm_head's int8 copy is its own)."""
    if method not in METHODS:
        raise ValueError(f"quantization must be one of {METHODS} (or None), got {method!r}")
    if torch.device(device).type != "cpu":
        raise ValueError(f"quantization={method!r} runs on the CPU (PyTorch's weight-only kernels); on "
                         f"{torch.device(device).type} load the model unquantized")
    cls = Int8Linear if method == "int8" else Int4Linear
    n = 0
    for layer in decoder.layers:
        for name, child in list(layer.named_modules()):
            for attr, sub in list(child.named_children()):
                if type(sub) is nn.Linear:
                    setattr(child, attr, cls(sub, dtype))
                    n += 1
    if type(getattr(decoder, "lm_head", None)) is nn.Linear:
        decoder.lm_head = Int8Linear(decoder.lm_head, dtype)
        n += 1
    return n


def quantized_bytes(module: nn.Module) -> int:
    """Bytes of a module's quantized weights (their int8 / packed int4 buffers and scales)."""
    return sum(b.numel() * b.element_size() for m in module.modules() if isinstance(m, (Int8Linear, Int4Linear))
               for b in m.buffers(recurse=False))
