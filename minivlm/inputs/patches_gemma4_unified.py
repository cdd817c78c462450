"""Gemma 4 12B's (gemma4_unified) image processor in plain torch: transformers 5.23 has it only on its torchvision
backend (image_processing_gemma4_unified.py), and torchvision is no requirement here. The same steps, checked against
transformers' own processor in a venv with torchvision (tests/fixtures/gemma4_unified_reference.npz, written by
tools/make_gemma4_unified_reference.py): the image as a uint8 tensor, resized (aspect kept) to the largest size whose
16-px patches fit the soft-token budget with both sides multiples of 48 px (torch's antialiased bicubic kernel on
uint8, which torchvision's resize calls), times 1/255, cut into 48 x 48 merged patches (each 16-px 3 x 3 group, pixel
rows then columns then channels), row-major, each with its (x, y) on the merged grid, padded to the budget with
zeros at (-1, -1). One soft token per merged patch: the model has no encoder to pool them."""
import numpy as np
import torch
from transformers.image_processing_utils import BaseImageProcessor, BatchFeature
from transformers.image_utils import PILImageResampling
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorKwargs

from minivlm.inputs.soft_tokens import SOFT_TOKEN_BUDGETS, soft_token_size


def merged_patches(image: torch.Tensor, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[3, H, W] (sides multiples of `side`) -> (patches [H/side * W/side, side * side * 3] in row-major order, each
    flattened as rows, columns, channels; their (x, y) on the patch grid)."""
    c, h, w = image.shape
    rows, cols = h // side, w // side
    patches = image.reshape(c, rows, side, cols, side).permute(1, 3, 2, 4, 0).reshape(rows * cols, -1)
    ys, xs = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    return patches, torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1)


def resized(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8 [3, H, W] at (height, width): torch's antialiased bicubic kernel on uint8 (torchvision's resize calls
    it)."""
    if tuple(image.shape[-2:]) == size:
        return image
    return torch.nn.functional.interpolate(image[None].contiguous(), size=size, mode="bicubic", align_corners=False,
                                           antialias=True)[0]


class Gemma4UnifiedImageProcessorTorch(BaseImageProcessor):
    """transformers' Gemma4UnifiedImageProcessor without torchvision: the same saved fields and outputs
    (pixel_values [images, budget, 48 * 48 * 3], image_position_ids [images, budget, 2], num_soft_tokens_per_image)."""
    resample = PILImageResampling.BICUBIC
    image_mean = [0.0, 0.0, 0.0]
    image_std = [1.0, 1.0, 1.0]
    size = None
    do_convert_rgb = True
    do_resize = True
    do_rescale = True
    rescale_factor = 1 / 255
    do_normalize = False
    patch_size = 16
    max_soft_tokens = 280
    pooling_kernel_size = 3
    valid_kwargs = Gemma4ImageProcessorKwargs
    model_input_names = ["pixel_values", "image_position_ids", "num_soft_tokens_per_image"]

    def __init__(self, **kwargs):
        kwargs.pop("image_processor_type", None)
        super().__init__(**kwargs)
        self._set_attributes(**kwargs)
        if self.max_soft_tokens not in SOFT_TOKEN_BUDGETS:
            raise ValueError(f"`max_soft_tokens` must be one of {SOFT_TOKEN_BUDGETS}, got {self.max_soft_tokens}.")

    def to_dict(self) -> dict:
        out = super().to_dict()
        out["image_processor_type"] = "Gemma4UnifiedImageProcessor"  # transformers' class, as a published checkpoint
        return out

    def _validate_preprocess_kwargs(self, **kwargs):
        kwargs["do_resize"] = False  # the resize is the budget's, not a `size` (transformers' class does the same)
        super()._validate_preprocess_kwargs(**kwargs)

    def process_image(self, image, do_convert_rgb: bool | None = None, **kwargs) -> torch.Tensor:
        """A PIL image (or HWC uint8 array) as a uint8 [3, H, W] tensor, RGB."""
        if hasattr(image, "convert"):
            image = image.convert("RGB") if do_convert_rgb and image.mode != "RGB" else image
            image = np.array(image)  # a writable copy
        image = torch.from_numpy(np.ascontiguousarray(image))
        if image.ndim == 2:
            image = image[..., None].expand(-1, -1, 3)
        return image.permute(2, 0, 1).contiguous()

    def _preprocess(self, images: list[torch.Tensor], do_resize=True, do_rescale=True, rescale_factor=1 / 255,
                    do_normalize=False, return_tensors=None, patch_size=None, max_soft_tokens=None,
                    pooling_kernel_size=None, **kwargs) -> BatchFeature:
        if max_soft_tokens not in SOFT_TOKEN_BUDGETS:
            raise ValueError(f"`max_soft_tokens` must be one of {SOFT_TOKEN_BUDGETS}, got {max_soft_tokens}.")
        if do_normalize:
            raise ValueError("Gemma4UnifiedImageProcessorTorch: do_normalize is not built (the model's own is off)")
        side = patch_size * pooling_kernel_size
        # every image padded to the budget: zeros at (-1, -1); filled in place (an image at 1120 tokens is 31 MB)
        pixels = torch.zeros(len(images), max_soft_tokens, side * side * 3)
        positions = torch.full((len(images), max_soft_tokens, 2), -1, dtype=torch.long)
        counts = []
        for i, image in enumerate(images):
            if do_resize:
                size = soft_token_size(image.shape[-2], image.shape[-1], patch_size, pooling_kernel_size,
                                       max_soft_tokens)
                image = resized(image, size)
            patches, xy = merged_patches(image, side)  # still uint8: the rescale below is per element, as HF's
            n = patches.shape[0]
            if do_rescale:
                torch.mul(patches, rescale_factor, out=pixels[i, :n])  # uint8 * float: fp32, HF's `image * scale`
            else:
                pixels[i, :n] = patches
            positions[i, :n] = xy
            counts.append(n)
        data = {"pixel_values": pixels, "image_position_ids": positions,
                "num_soft_tokens_per_image": counts}
        return BatchFeature(data=data, tensor_type=return_tensors)
