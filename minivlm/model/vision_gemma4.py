"""Gemma 4's vision half: transformers' Gemma4VisionModel (patches with learned 2-D position rows, a ViT with axial
RoPE and clipped linears, patches average-pooled k x k into soft tokens, scaled) and its Gemma4MultimodalEmbedder
(an unweighted RMSNorm and one projection), run by Gemma4Model's own get_image_features, hosted in a module that
holds only these two (no decoder, no audio tower). Each image is one row of pixel_values: its patches padded to the
budget's patch count, with each patch's (x, y) beside it ((-1, -1): padding), so images of different sizes batch."""
import torch
from transformers import AttentionInterface, AutoModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.models.gemma4.modeling_gemma4 import Gemma4Model, Gemma4MultimodalEmbedder, Gemma4PreTrainedModel

from minivlm.model.tower_boundaries import add_boundaries, sliced_sdpa
from minivlm.model.vision import load_module

# the towers' sliced SDPA under a name whose masks transformers builds as SDPA's: Gemma 4's padding patches must be
# masked (under an attention name it does not know, transformers builds no mask at all)
ATTN_IMPLEMENTATION = "minivlm_sliced_sdpa_masked"
AttentionInterface.register(ATTN_IMPLEMENTATION, sliced_sdpa)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


class Gemma4Vision(Gemma4PreTrainedModel):
    """The vision half of Gemma4Model: the same attribute names, so the checkpoint's keys load as they are."""

    def __init__(self, config):
        super().__init__(config)
        self.vision_tower = AutoModel.from_config(config.vision_config)
        self.embed_vision = Gemma4MultimodalEmbedder(config.vision_config, config.text_config)

    get_image_features = Gemma4Model.get_image_features


class Gemma4VisionTower:
    """Images (one pixel row each, their patch positions as the layout's mask) -> per-image embeddings, in the order
    of their placeholder tokens."""

    def __init__(self, config, state_dict: dict, device, dtype):
        config.vision_config._attn_implementation = ATTN_IMPLEMENTATION  # SDPA with its masks, with boundaries
        self.module = load_module(Gemma4Vision, config, state_dict, device, dtype)
        add_boundaries(self.module)  # where a sliced tower may stop (the engine's vision thread)
        self.device, self.dtype = device, dtype

    @torch.inference_mode()
    def encode(self, pixel_values: torch.Tensor, layout) -> list[tuple[torch.Tensor, list]]:
        """pixel_values [images, patches, 3 * patch²]; layout = (rows per image (1 each), patch positions
        [images, patches, 2]). Returns, per image, (embeddings [its soft tokens, hidden], [])."""
        _, positions = layout
        out = self.module.get_image_features(pixel_values.to(self.device, self.dtype),
                                             positions.to(self.device), return_dict=True).pooler_output
        return [(e, []) for e in out]

    def num_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.module.parameters())
