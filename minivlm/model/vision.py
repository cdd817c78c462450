"""The vision tower is transformers' own module, built from the checkpoint's vision_config and its weights."""
import torch
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

TOWERS = {"qwen2_vl": Qwen2VisionTransformerPretrainedModel, "qwen2_5_vl": Qwen2_5_VisionTransformerPretrainedModel,
          "qwen3_vl": Qwen3VLVisionModel}


class VisionTower:
    """Wraps the HF vision module: pixels of several images -> per-image embeddings (+ deepstack features)."""

    def __init__(self, model_type: str, vision_config, state_dict: dict, device, dtype):
        vision_config._attn_implementation = "sdpa"
        self.module = TOWERS[model_type]._from_config(vision_config)
        missing, unexpected = self.module.load_state_dict(state_dict, strict=False)
        if missing or unexpected:
            raise ValueError(f"vision weights do not match the config: missing {missing[:5]}, unexpected {unexpected[:5]}")
        self.module.to(device=device, dtype=dtype).eval()
        self.merge = vision_config.spatial_merge_size
        self.device, self.dtype = device, dtype

    @torch.inference_mode()
    def encode(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
        """Returns, per image, (embeddings [tokens, hidden], deepstack features: list of [tokens, hidden])."""
        out = self.module(pixel_values.to(self.device, self.dtype), grid_thw=grid_thw.to(self.device), return_dict=True)
        sizes = (grid_thw.prod(-1) // self.merge ** 2).tolist()
        embeds = torch.split(out.pooler_output, sizes)
        deep = [torch.split(f, sizes) for f in (getattr(out, "deepstack_features", None) or [])]
        return [(e, [d[i] for d in deep]) for i, e in enumerate(embeds)]

    def num_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.module.parameters())
