"""Vision for the tiled families: transformers' own tower and connector, and their own get_image_features,
hosted in a module that holds only the vision half of the checkpoint (no second copy of the decoder).
SmolVLM2 / Idefics3: SigLIP + pixel-shuffle connector; InternVL: InternViT + pixel-shuffle MLP projector."""
import torch
from transformers import AutoModel
from transformers.models.idefics3.modeling_idefics3 import (Idefics3Connector, Idefics3Model, Idefics3PreTrainedModel,
                                                            Idefics3VisionTransformer)
from transformers.models.internvl.modeling_internvl import (InternVLModel, InternVLMultiModalProjector,
                                                            InternVLPreTrainedModel)
from transformers.models.smolvlm.modeling_smolvlm import (SmolVLMConnector, SmolVLMModel, SmolVLMPreTrainedModel,
                                                          SmolVLMVisionTransformer)

from minivlm.model.tower_boundaries import ATTN_IMPLEMENTATION, add_boundaries
from minivlm.model.vision import load_module


class SmolVLMVision(SmolVLMPreTrainedModel):
    """The vision half of SmolVLMModel: the same attribute names, so the checkpoint's keys load as they are."""

    def __init__(self, config):
        super().__init__(config)
        self.vision_model = SmolVLMVisionTransformer._from_config(config.vision_config)
        self.connector = SmolVLMConnector(config)

    get_image_features = SmolVLMModel.get_image_features


class Idefics3Vision(Idefics3PreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.vision_model = Idefics3VisionTransformer._from_config(config.vision_config)
        self.connector = Idefics3Connector(config)

    get_image_features = Idefics3Model.get_image_features


class InternVLVision(InternVLPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.vision_tower = AutoModel.from_config(config.vision_config)
        self.multi_modal_projector = InternVLMultiModalProjector(config)

    get_image_features = InternVLModel.get_image_features
    pixel_shuffle = InternVLModel.pixel_shuffle


HOSTS = {"smolvlm": SmolVLMVision, "idefics3": Idefics3Vision, "internvl": InternVLVision}


class TiledVisionTower:
    """Tiles of several images -> per-image embeddings, in the order of their placeholder tokens."""

    def __init__(self, model_type: str, config, state_dict: dict, device, dtype):
        config.vision_config._attn_implementation = ATTN_IMPLEMENTATION  # SDPA, with boundaries
        self.module = load_module(HOSTS[model_type], config, state_dict, device, dtype)
        add_boundaries(self.module)  # where a sliced tower may stop (the engine's vision thread)
        self.crops = isinstance(self.module, InternVLVision)  # a batch of crops; SmolVLM takes one sample of tiles
        self.device, self.dtype = device, dtype

    @torch.inference_mode()
    def encode(self, pixel_values: torch.Tensor, layout) -> list[tuple[torch.Tensor, list]]:
        """layout = (tiles per image, pixel mask [tiles, H, W] or None). Returns, per image, (embeddings, [])."""
        tiles, mask = layout
        pixels = pixel_values.to(self.device, self.dtype)
        if self.crops:
            out = self.module.get_image_features(pixels, return_dict=True).pooler_output  # [tiles, tokens, hidden]
            flat = out.reshape(-1, out.shape[-1])
        else:  # SmolVLM / Idefics3 take a batch of one sample holding every tile
            mask = mask[None].to(self.device) if mask is not None else None
            flat = self.module.get_image_features(pixels[None], mask, return_dict=True).pooler_output[0]
        per_tile = flat.shape[0] // pixel_values.shape[0]
        return [(e, []) for e in torch.split(flat, [n * per_tile for n in tiles])]

    def num_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.module.parameters())
