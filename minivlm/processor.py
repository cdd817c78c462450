"""Image-only Qwen-VL processors: transformers' processors minus the video slot (which needs torchvision)."""
from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer
from transformers.models.qwen2_5_vl import Qwen2_5_VLConfig, Qwen2_5_VLProcessor
from transformers.models.qwen2_vl import Qwen2VLConfig, Qwen2VLImageProcessorPil, Qwen2VLProcessor
from transformers.models.qwen3_vl import Qwen3VLConfig, Qwen3VLProcessor


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


PROCESSORS = {
    "qwen2_vl": (Qwen2VLConfig, Qwen2VLImageOnlyProcessor),
    "qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLImageOnlyProcessor),
    "qwen3_vl": (Qwen3VLConfig, Qwen3VLImageOnlyProcessor),
}


def register_processors():
    """Make AutoProcessor return the image-only processors (unregistered it returns a bare tokenizer)."""
    for config_cls, proc_cls in PROCESSORS.values():
        AutoProcessor.register(config_cls, proc_cls, exist_ok=True)


def load_processor(model_dir: str, model_type: str):
    """Build the image-only processor of a checkpoint dir, whatever its processor_class says."""
    if model_type not in PROCESSORS:
        raise ValueError(f"no processor for model_type {model_type!r}; supported: {sorted(PROCESSORS)}")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    try:
        image_processor = AutoImageProcessor.from_pretrained(model_dir, backend="pil")
    except (OSError, ValueError, TypeError):
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(model_dir)
    if not isinstance(image_processor, Qwen2VLImageProcessorPil):
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(model_dir)
    chat_template = getattr(tokenizer, "chat_template", None)
    return PROCESSORS[model_type][1](image_processor, tokenizer, chat_template=chat_template)


register_processors()
