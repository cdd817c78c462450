"""Gemma 4 12B's (gemma4_unified) way from pixels to tokens: no vision encoder. transformers' own
Gemma4UnifiedVisionEmbedder takes each merged 48 x 48 patch's raw pixels through a LayerNorm, one linear and a
LayerNorm, adds the factorized position table's rows of its x and of its y, a LayerNorm, then an unweighted RMSNorm
and the projection into the text width; Gemma4UnifiedModel.get_image_features drops the padding patches. Both are
hosted here in a module that holds only the embedder (no decoder, no audio embedder). The checkpoint names its
parts as the original release did (vision_embedder.patch_dense, embed_vision.embedding_projection, ...):
transformers' own renaming for this model type (conversion_mapping.py) maps them to the module's names. Each image
is one row of pixel_values: its merged patches padded to the budget, its patch positions beside it ((-1, -1):
padding), as for gemma4's tower (vision_gemma4.py)."""
import torch
from transformers.conversion_mapping import get_checkpoint_conversion_mapping
from transformers.models.gemma4_unified.modeling_gemma4_unified import (Gemma4UnifiedModel,
                                                                        Gemma4UnifiedPreTrainedModel,
                                                                        Gemma4UnifiedVisionEmbedder)

from minivlm.model.tower_boundaries import add_boundaries
from minivlm.model.vision import load_module


class Gemma4UnifiedVision(Gemma4UnifiedPreTrainedModel):
    """The image half of Gemma4UnifiedModel: its embed_vision, nothing else."""

    def __init__(self, config):
        super().__init__(config)
        self.embed_vision = Gemma4UnifiedVisionEmbedder(config.vision_config, config.text_config)

    get_image_features = Gemma4UnifiedModel.get_image_features


def renamed(state_dict: dict) -> dict:
    """The checkpoint's keys as transformers renames them when it loads a gemma4_unified checkpoint."""
    renames = get_checkpoint_conversion_mapping("gemma4_unified") or []
    out = {}
    for key, tensor in state_dict.items():
        for rule in renames:
            key, _ = rule.rename_source_key(key)
        out[key] = tensor
    return out


class Gemma4UnifiedPatchEmbedder:
    """Images (one pixel row each, their merged patches' positions as the layout's mask) -> per-image embeddings, one
    row per real merged patch, in the order of their placeholder tokens."""
    has_encoder = False  # pixels become tokens through one linear and norms (the Anatomy tab says so)

    def __init__(self, config, state_dict: dict, device, dtype):
        self.module = load_module(Gemma4UnifiedVision, config, renamed(state_dict), device, dtype)
        add_boundaries(self.module)  # where the engine's vision thread may pause it (between its norms and linears)
        self.device, self.dtype = device, dtype

    @torch.inference_mode()
    def encode(self, pixel_values: torch.Tensor, layout) -> list[tuple[torch.Tensor, list]]:
        """pixel_values [images, budget, 48 * 48 * 3]; layout = (rows per image (1 each), positions [images, budget,
        2]). Returns, per image, (embeddings [its soft tokens, hidden], [])."""
        _, positions = layout
        out = self.module.get_image_features(pixel_values.to(self.device, self.dtype), positions.to(self.device),
                                             return_dict=True).pooler_output
        return [(e, []) for e in out]

    def num_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.module.parameters())
