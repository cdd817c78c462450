"""The vision tower is transformers' own module, built from the checkpoint's vision_config and its weights, with
its Conv3d patch embedding run as the matrix product it is (the loader then gives its linear layers the engine's
linear backend: model/backends/)."""
import torch
from torch import nn
from transformers.initialization import no_init_weights
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

from minivlm.model.tower_boundaries import ATTN_IMPLEMENTATION, add_boundaries

TOWERS = {"qwen2_vl": Qwen2VisionTransformerPretrainedModel, "qwen2_5_vl": Qwen2_5_VisionTransformerPretrainedModel,
          "qwen3_vl": Qwen3VLVisionModel,
          "qwen3_5": Qwen3_5VisionModel}  # Qwen3-VL's tower without deepstack: encode's features list stays empty


class PatchProjection(nn.Linear):
    """A Conv3d whose kernel equals its stride and covers the whole input patch is one matrix product per patch:
    [N, C, T, P, P] -> [N, embed, 1, 1, 1], the shape the tower's patch embedding expects from its Conv3d."""

    @classmethod
    def from_conv(cls, conv: nn.Conv3d) -> "PatchProjection":
        if conv.kernel_size != conv.stride or conv.padding != (0, 0, 0) or conv.groups != 1:
            raise ValueError(f"patch embedding {conv} is not a per-patch projection")
        w = conv.weight
        linear = cls(w[0].numel(), w.shape[0], bias=conv.bias is not None, device="meta")
        linear.weight = nn.Parameter(w.detach().reshape(w.shape[0], -1), requires_grad=False)
        if conv.bias is not None:
            linear.bias = nn.Parameter(conv.bias.detach(), requires_grad=False)
        return linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.flatten(1))[:, :, None, None, None]


def load_module(cls, config, state_dict: dict, device, dtype) -> nn.Module:
    """transformers' module `cls` built from `config` (no random init: the checkpoint overwrites it), its weights
    loaded strictly, on device in dtype, in eval mode. Built in dtype as from_pretrained builds it: buffers made in
    fp32 on purpose (the ViT rotary's inv_freq) stay fp32; a cast after would round them (#40.9: bf16 drift)."""
    with no_init_weights():
        module = cls._from_config(config, dtype=dtype)
    missing, unexpected = module.load_state_dict(state_dict, strict=False)
    if missing or unexpected:
        raise ValueError(f"vision weights do not match the config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return module.to(device=device).eval()


class VisionTower:
    """Wraps the HF vision module: pixels of several images -> per-image embeddings (+ deepstack features)."""

    def __init__(self, model_type: str, vision_config, state_dict: dict, device, dtype):
        vision_config._attn_implementation = ATTN_IMPLEMENTATION  # SDPA, with boundaries
        self.module = load_module(TOWERS[model_type], vision_config, state_dict, device, dtype)
        # fp32: the Conv3d as the matrix product it is (faster); other dtypes keep HF's Conv3d, whose bits a CPU
        # without native bf16 does not reproduce as a matrix product (tests/test_bf16_drift.py)
        if dtype == torch.float32:
            self.module.patch_embed.proj = PatchProjection.from_conv(self.module.patch_embed.proj)
        add_boundaries(self.module)  # where a sliced tower may stop (the engine's vision thread)
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
