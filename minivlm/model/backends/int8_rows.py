"""The kernels an int8 layer (quantized.Int8Linear) may send its decode rows to (fp32 inputs of at most
gemv.MAX_ROWS rows): one class each, the same numbers for the weights (the layer's int8 values and scales), picked
at load by a timed decode step (calibrate.py: choose_int8, choose_int4 for an int4 engine's int8 lm_head); rows the
layer keeps (PyTorch's `_weight_int8pack_mm`, bf16 inputs) need none.

    GemvRows    gemv_int8.c, hand-written: on x86 with AVX2 each row quantized to int8 in blocks of 32 (llama.cpp's
                Q8_0 activations), `vpmaddubsw`.
    FbgemmRows  fbgemm's dynamic int8 linear (`torch.ops.quantized.linear_dynamic`, what
                `torch.ao.quantization.quantize_dynamic` runs): maintained, tuned per CPU by its authors (AVX2,
                AVX-512, VNNI); each row quantized to uint8 with one scale and zero point for the whole row. On
                real checkpoints' activations (a few channels hundreds of times the rest) one scale a row loses
                more than blocks of 32 (a 1024-wide row with one channel 40x the others: 3.0 % relative error of the
                product, Q8_0's blocks 0.9 %), so the calibration keeps it only where its logits stay close to the
                exact path's (calibrate.ROWS_TOLERANCE). PyTorch 2.13 deprecates the quantized tensors its packed
                weights are made from (a warning; "will be removed in a future release"): available() says so
                the day they are gone, and the calibration runs without it."""
import warnings

import torch

from minivlm.model.backends.cpu_kernels import gemv_int8


class GemvRows:
    name = "gemv"

    @staticmethod
    def available() -> str | None:
        """None where it runs here, else why not."""
        return None if gemv_int8.KERNELS.get() is not None else f"gemv_int8.c: {gemv_int8.KERNELS.error}"

    @staticmethod
    def prepare(layer) -> None:
        pass

    @staticmethod
    def release(layer) -> None:
        pass

    @staticmethod
    def __call__(layer, x: torch.Tensor) -> torch.Tensor:
        return gemv_int8.linear(torch.nn.functional.pad(x, (0, layer.pad)) if layer.pad else x, layer.qweight,
                                layer.scales_f32, layer.bias)


class FbgemmRows:
    """The layer's int8 weights and scales prepacked once for fbgemm (a second copy of the int8 weights, freed by
    release() where the calibration keeps another kernel). reduce_range=False: the rows take all 8 bits (fbgemm's
    7-bit range avoids an overflow of `vpmaddubsw` pairs, which its VNNI path does not have; on CPUs without VNNI
    the rare overflow saturates, which the calibration's logit check sees)."""
    name = "fbgemm"

    @staticmethod
    def available() -> str | None:
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            return f"this torch has no fbgemm (quantized engines: {torch.backends.quantized.supported_engines})"
        if not hasattr(torch, "_make_per_channel_quantized_tensor"):  # deprecated in 2.13 (it warns): gone later
            return "this torch makes no per-channel quantized tensors (fbgemm's packed weights need one)"
        return None

    @staticmethod
    def prepare(layer) -> None:
        if getattr(layer, "fbgemm_packed", None) is None:
            scale = layer.scales.double()
            with warnings.catch_warnings():  # PyTorch 2.13 deprecates quantized tensors, fbgemm's only way in
                warnings.simplefilter("ignore", UserWarning)
                w = torch._make_per_channel_quantized_tensor(layer.qweight[:, :layer.in_features].contiguous(),
                                                             scale, torch.zeros_like(scale, dtype=torch.long), 0)
            layer.fbgemm_packed = torch.ops.quantized.linear_prepack(w, layer.bias)

    @staticmethod
    def release(layer) -> None:
        layer.fbgemm_packed = None

    @staticmethod
    def __call__(layer, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, layer.fbgemm_packed, False)


GEMV, FBGEMM = GemvRows(), FbgemmRows()
KINDS = (GEMV, FBGEMM)
