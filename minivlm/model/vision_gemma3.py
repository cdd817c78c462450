"""Gemma 3's vision half: transformers' SigLIP tower and Gemma3MultiModalProjector (average-pool the patch grid to
mm_tokens_per_image, RMS-norm, project) and Gemma3Model's own get_image_features, hosted in a module that holds only
these two (no second copy of the decoder). Every image and every pan-and-scan crop is one fixed-size view of
mm_tokens_per_image tokens."""
import torch
from transformers import AutoModel
from transformers.models.gemma3.modeling_gemma3 import Gemma3Model, Gemma3MultiModalProjector, Gemma3PreTrainedModel

from minivlm.model.tower_boundaries import ATTN_IMPLEMENTATION, add_boundaries
from minivlm.model.vision import load_module


class Gemma3Vision(Gemma3PreTrainedModel):
    """The vision half of Gemma3Model: the same attribute names, so the checkpoint's keys load as they are."""

    def __init__(self, config):
        super().__init__(config)
        self.vision_tower = AutoModel.from_config(config.vision_config)
        self.multi_modal_projector = Gemma3MultiModalProjector(config)

    get_image_features = Gemma3Model.get_image_features


def current_keys(state_dict: dict) -> dict:
    """The published checkpoints' SiglipVisionModel keys (vision_tower.vision_model.*) as transformers 5 names them
    (vision_tower.*): from_pretrained renames them the same way."""
    return {k.replace("vision_tower.vision_model.", "vision_tower.", 1): v for k, v in state_dict.items()}


class Gemma3VisionTower:
    """Views of several images (each image, then its pan-and-scan crops) -> per-image embeddings, in the order of
    their placeholder tokens."""

    def __init__(self, config, state_dict: dict, device, dtype):
        config.vision_config._attn_implementation = ATTN_IMPLEMENTATION  # SDPA, with boundaries
        self.module = load_module(Gemma3Vision, config, current_keys(state_dict), device, dtype)
        add_boundaries(self.module)  # where a sliced tower may stop (the engine's vision thread)
        self.tokens_per_view = config.mm_tokens_per_image
        self.device, self.dtype = device, dtype

    @torch.inference_mode()
    def encode(self, pixel_values: torch.Tensor, layout) -> list[tuple[torch.Tensor, list]]:
        """pixel_values [views, 3, H, W]; layout = (views per image, None). Returns, per image, (embeddings
        [views x mm_tokens_per_image, hidden], [])."""
        views, _ = layout
        out = self.module.get_image_features(pixel_values.to(self.device, self.dtype), return_dict=True).pooler_output
        flat = out.reshape(-1, out.shape[-1])  # [views x tokens, hidden], views in order
        return [(e, []) for e in torch.split(flat, [n * self.tokens_per_view for n in views])]

    def num_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.module.parameters())
