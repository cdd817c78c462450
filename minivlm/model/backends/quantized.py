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
    int4  asymmetric, one scale and zero point per group of GROUP input channels (64 or 32 where GROUP does not
          divide the width); PyTorch's packed layout,
          torch.ops.aten._weight_int4pack_mm_for_cpu, or for decode steps the one-call C step over the same values
          as nibbles (decode_layer_int4.c, int4_weights.h: inputs in int8 blocks of 32, integer dot products; widths
          a multiple of 64) where the load's calibration finds it faster; that copy is kept beside PyTorch's
          (prompts run PyTorch's kernel), freed where PyTorch's is kept

Both are the CPU's: on CUDA and MPS the option is refused (PyTorch ships no weight-only int8 CUDA matmul of this
form; bitsandbytes / torchao would be the way there).

PyTorch's kernels check little and trust the shapes (aten/src/ATen/native/cpu/int8mm_kernel.cpp, int4mm_kernel.cpp):
the int8 one reads K (input channels) 16 bf16 inputs and 16 weights at a time on AVX-512 (8 on AVX2 and ARM) with
loads that assume each input row starts 32 bytes aligned, so a K that is not a multiple of 16, or an input that
starts elsewhere, reads past the row (inf / nan) or faults and ends the process (issue #52: K = 24, 56, 100 ...).
The int4 one takes N (output channels) in blocks of 16 and K in whole groups. So the weights are padded here, once,
to what the kernels take: input columns up to a multiple of K_MULTIPLE (int8: zeros) or of the group (int4: the
last real column repeated), whose inputs are zeros, and int4's output rows up to a multiple of N_MULTIPLE (their
outputs dropped); and every input reaches a kernel through kernel_input (bf16, contiguous, ALIGN-aligned, padded). Any width then quantizes and
gives the unpadded layer's numbers; `padded_layers` names the layers that needed it."""
import torch
import torch.nn.functional as F
from torch import nn

from minivlm.model.backends import int8_rows
from minivlm.model.backends.cpu_kernels import gemv_int4

METHODS = ("int8", "int4")
GROUP = 128  # int4 group size (input channels per scale / zero point): PyTorch's kernel takes 32, 64, 128 or 256
GROUPS = (GROUP, 64, 32)  # a layer takes the first that divides its width (SmolVLM2-256M's 576: 64), else pads to 32
K_MULTIPLE = 16  # int8 kernel's widest step over K (AVX-512: 16 floats); also 32-byte aligned rows of bf16 inputs
N_MULTIPLE = 16  # int4 kernel's output block (_convert_weight_to_int4pack_for_cpu: "expect N to be dividable by 16")
ALIGN = 64  # bytes: where an input handed to the kernels starts (PyTorch's CPU allocator aligns to 64 too)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def kernel_input(x: torch.Tensor, in_features: int, width: int) -> torch.Tensor:
    """x's rows as PyTorch's packed kernels may read them: bf16, contiguous, starting ALIGN-aligned, zero-padded to
    the weight's `width` columns. x itself where it already is so; else one copy (fp32 inputs were copied to bf16
    anyway)."""
    rows = x.reshape(-1, in_features)
    if width == in_features and rows.dtype == torch.bfloat16 and rows.is_contiguous() and \
            rows.data_ptr() % ALIGN == 0:
        return rows
    out = (torch.zeros if width > in_features else torch.empty)(rows.shape[0], width, dtype=torch.bfloat16,
                                                                 device=rows.device)
    out[:, :in_features] = rows
    if out.data_ptr() % ALIGN:  # never with PyTorch's allocator; a fault would end the process, so check it
        raise RuntimeError(f"kernel_input: a fresh tensor starts at {out.data_ptr() % ALIGN} bytes past {ALIGN}")
    return out


class Int8Linear(nn.Module):
    """y = x @ (q * scale).T + b, with q int8 [out, in] and one scale per output row; q's columns zero-padded to a
    multiple of K_MULTIPLE where `in` is not one (`pad`). fp32 inputs of at most `small_rows` rows run `rows_kernel`
    (a decode step: gemv_int8.c, or fbgemm's dynamic int8 linear; int8_rows.py; the calibration at load sets both
    where that is faster), the rest PyTorch's kernel, which takes x in bf16."""
    small_rows = 0
    rows_kernel = int8_rows.GEMV

    def __init__(self, linear: nn.Linear, dtype: torch.dtype):
        super().__init__()
        w = linear.weight.detach().float()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.pad = round_up(self.in_features, K_MULTIPLE) - self.in_features
        scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).to(torch.bfloat16)  # rounded first: q is against it
        q = torch.round(w / scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
        self.register_buffer("qweight", F.pad(q, (0, self.pad)).contiguous())  # zero columns times zero inputs
        self.register_buffer("scales", scale)
        self.register_buffer("scales_f32", scale.float(), persistent=False)  # the same numbers, for gemv_int8.c
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and x.numel() <= self.small_rows * self.in_features:
            return self.rows_kernel(self, x)
        y = torch.ops.aten._weight_int8pack_mm(kernel_input(x, self.in_features, self.qweight.shape[1]),
                                               self.qweight, self.scales)
        y = y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        return y + self.bias if self.bias is not None else y

    def dequantized(self) -> torch.Tensor:
        return self.qweight[:, :self.in_features].float() * self.scales.float()[:, None]


class Int4Linear(nn.Module):
    """Group-wise int4: w ≈ (q - 8) · scale + zero per group of `group` input channels (the first of GROUPS that
    divides the width, padded to a multiple of 32 where none does), q in [0, 15]; output rows padded to a multiple
    of N_MULTIPLE. Padded input columns repeat the last real one (the group's range stays the real weights'; their
    inputs are zeros), padded rows are zeros (their outputs are dropped)."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype):
        super().__init__()
        w = linear.weight.detach().float()
        out, inp = w.shape
        self.in_features, self.out_features = inp, out
        width = round_up(inp, GROUPS[-1])
        self.group = next(g for g in GROUPS if width % g == 0)
        w = torch.cat([w, w[:, -1:].expand(out, width - inp)], 1)
        w = F.pad(w, (0, 0, 0, round_up(out, N_MULTIPLE) - out))
        rows = w.shape[0]
        g = w.reshape(rows, width // self.group, self.group)
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        scale = ((hi - lo) / 15).clamp(min=1e-12)
        q = torch.round((g - lo) / scale).clamp(0, 15).to(torch.int32).reshape(rows, width)
        zero = lo + 8 * scale  # the kernel computes (q - 8) * scale + zero
        self.register_buffer("qweight", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
        self.register_buffer("scales_zeros", torch.stack([scale[..., 0], zero[..., 0]], -1).transpose(0, 1)
                             .contiguous().to(torch.bfloat16))  # [width / group, rows, 2]
        self.bias = linear.bias
        self.c_nibbles = self.c_sm = None  # the same weights for the C decode step (int4_weights.h), where it fits
        if width == inp and gemv_int4.fits(inp, self.group):  # freed by the calibration where PyTorch's is kept
            s, z = (t[:out, :, 0].to(torch.bfloat16).float() for t in (scale, zero))  # the kernel's numbers
            self.c_nibbles, self.c_sm = gemv_int4.pack(q[:out], s, z - 8 * s)

    exact = None  # the calibration's reference steps: "fp32" or "q8" (inputs in int8 blocks), times c_dequantized()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.exact:
            rows = x.reshape(-1, self.in_features).float()
            rows = gemv_int4.q8_round(rows).float() if self.exact == "q8" else rows
            y = F.linear(rows, self.c_dequantized(), self.bias)
            return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        width = self.scales_zeros.shape[0] * self.group
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(kernel_input(x, self.in_features, width), self.qweight,
                                                       self.group, self.scales_zeros)
        y = y[:, :self.out_features].reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        return y + self.bias if self.bias is not None else y

    def dequantized(self) -> torch.Tensor:
        """The weight the kernel multiplies by, recovered by multiplying the identity (the layout is PyTorch's)."""
        width = self.scales_zeros.shape[0] * self.group
        eye = torch.eye(width, dtype=torch.bfloat16)
        w = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.qweight, self.group, self.scales_zeros)
        return w.float().t()[:self.out_features, :self.in_features]

    def c_dequantized(self) -> torch.Tensor:
        """The fp32 weight the C step multiplies by: q * scale + minimum from its copy (gemv_int4.pack's layout)."""
        return gemv_int4.unpack(self.c_nibbles, self.c_sm, self.group)

    def release_c(self):
        """Free the C step's copy (the calibration kept PyTorch's kernel)."""
        self.c_nibbles = self.c_sm = None


def quantize(decoder: nn.Module, method: str, device, dtype: torch.dtype) -> int:
    """Replace the decoder layers' nn.Linear by their quantized form and the lm_head by an int8 one, in place;
    returns how many. The embeddings keep the engine's dtype (a tied lm_head's int8 copy is its own)."""
    if method not in METHODS:
        raise ValueError(f"quantization must be one of {METHODS} (or None), got {method!r}")
    if torch.device(device).type != "cpu":
        raise ValueError(f"quantization={method!r} runs on the CPU (PyTorch's weight-only kernels); on "
                         f"{torch.device(device).type} load the model unquantized")
    cls = Int8Linear if method == "int8" else Int4Linear

    def quantized(linear: nn.Linear, name: str, kind=cls) -> nn.Module:  # a refusal names the layer and its shape
        why = "it has no weights" if linear.weight.numel() == 0 else ""
        if not why:
            try:
                return kind(linear, dtype)
            except (RuntimeError, ValueError) as e:  # what PyTorch's packing refuses
                why = str(e)
        raise ValueError(f"quantization={method!r}: layer {name} ({linear.in_features} inputs, "
                         f"{linear.out_features} outputs) cannot be quantized: {why}")
    n = 0
    for i, layer in enumerate(decoder.layers):
        for name, child in list(layer.named_modules()):
            for attr, sub in list(child.named_children()):
                if type(sub) is nn.Linear:
                    setattr(child, attr, quantized(sub, ".".join(filter(None, (f"layers.{i}", name, attr)))))
                    n += 1
    if type(getattr(decoder, "lm_head", None)) is nn.Linear:
        decoder.lm_head = quantized(decoder.lm_head, "lm_head", Int8Linear)
        n += 1
    return n


def padded_layers(decoder: nn.Module) -> dict[str, tuple[int, int]]:
    """Quantized layers whose weights were padded for PyTorch's kernels: name -> (in, out) as the kernel sees them."""
    out = {}
    for name, m in decoder.named_modules():
        if isinstance(m, Int8Linear) and m.pad:
            out[name] = (m.qweight.shape[1], m.out_features)
        elif isinstance(m, Int4Linear) and (m.scales_zeros.shape[0] * m.group, m.scales_zeros.shape[1]) != \
                (m.in_features, m.out_features):
            out[name] = (m.scales_zeros.shape[0] * m.group, m.scales_zeros.shape[1])
    return out


def quantized_bytes(module: nn.Module) -> int:
    """Bytes of a module's quantized weights (their int8 / packed int4 buffers and scales)."""
    return sum(b.numel() * b.element_size() for m in module.modules() if isinstance(m, (Int8Linear, Int4Linear))
               for b in m.buffers(recurse=False))
