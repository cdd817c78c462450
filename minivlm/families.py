"""The three Qwen-VL families minivlm runs, and every fact that differs between them, in one registry."""
from dataclasses import dataclass

from transformers.models.qwen2_5_vl import Qwen2_5_VLConfig, Qwen2_5_VLProcessor
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
from transformers.models.qwen2_vl import Qwen2VLConfig, Qwen2VLProcessor
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel
from transformers.models.qwen3_vl import Qwen3VLConfig, Qwen3VLProcessor
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel


class Qwen2VLImageOnlyProcessor(Qwen2VLProcessor):
    """Qwen2-VL processor for images and text only (no video processor, so no torchvision)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


class Qwen2_5_VLImageOnlyProcessor(Qwen2_5_VLProcessor):
    """Qwen2.5-VL processor for images and text only."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


class Qwen3VLImageOnlyProcessor(Qwen3VLProcessor):
    """Qwen3-VL processor for images and text only."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


@dataclass(frozen=True)
class Family:
    """One model family. Processor defaults are those of the published checkpoints' preprocessor_config.json."""
    model_type: str                 # config.json's model_type
    title: str
    config_class: type
    processor_class: type           # the image-only processor
    vision_tower_class: type        # transformers' vision module, used as is
    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    qk_norm: bool                   # RMSNorm on q and k per head
    interleaved_mrope: bool         # t/h/w frequencies interleaved (else contiguous chunks; a config flag may override)
    deepstack: bool                 # ViT layer features added to the first decoder layers' image rows


FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("qwen2_vl", "Qwen2-VL", Qwen2VLConfig, Qwen2VLImageOnlyProcessor, Qwen2VisionTransformerPretrainedModel,
           patch_size=14, merge_size=2, min_pixels=56 * 56, max_pixels=28 * 28 * 16384,
           qk_norm=False, interleaved_mrope=False, deepstack=False),
    Family("qwen2_5_vl", "Qwen2.5-VL", Qwen2_5_VLConfig, Qwen2_5_VLImageOnlyProcessor,
           Qwen2_5_VisionTransformerPretrainedModel, patch_size=14, merge_size=2, min_pixels=56 * 56,
           max_pixels=28 * 28 * 16384, qk_norm=False, interleaved_mrope=False, deepstack=False),
    Family("qwen3_vl", "Qwen3-VL", Qwen3VLConfig, Qwen3VLImageOnlyProcessor, Qwen3VLVisionModel,
           patch_size=16, merge_size=2, min_pixels=256 * 256, max_pixels=4096 * 4096,
           qk_norm=True, interleaved_mrope=True, deepstack=True),
)}


def get_family(model_type: str) -> Family:
    """The family of a config's model_type, or a clear error naming the ones minivlm runs."""
    if model_type not in FAMILIES:
        raise ValueError(f"unsupported architecture {model_type!r}; minivlm runs {', '.join(FAMILIES)}")
    return FAMILIES[model_type]
