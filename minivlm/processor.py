"""Image-only Qwen-VL processors: transformers' processors minus the video slot (which needs torchvision)."""
from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer
from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

from minivlm.families import FAMILIES, get_family

PROCESSORS = {name: (f.config_class, f.processor_class) for name, f in FAMILIES.items()}  # a view of the registry


def register_processors():
    """Make AutoProcessor return the image-only processors (unregistered it returns a bare tokenizer)."""
    for family in FAMILIES.values():
        AutoProcessor.register(family.config_class, family.processor_class, exist_ok=True)


def load_processor(model_dir: str, model_type: str):
    """Build the image-only processor of a checkpoint dir, whatever its processor_class says."""
    family = get_family(model_type)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    try:
        image_processor = AutoImageProcessor.from_pretrained(model_dir, backend="pil")
    except (OSError, ValueError, TypeError):
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(model_dir)
    if not isinstance(image_processor, Qwen2VLImageProcessorPil):
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(model_dir)
    chat_template = getattr(tokenizer, "chat_template", None)
    return family.processor_class(image_processor, tokenizer, chat_template=chat_template)


register_processors()
