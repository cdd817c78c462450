"""Each family's processor, image-only (transformers' processors minus the video slot, which needs torchvision),
built from the checkpoint's own files; a text model's "processor" is its tokenizer alone."""
import inspect
import json
import os

from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer
from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

from minivlm.families import FAMILIES, get_family
from minivlm.inputs.patches_gemma4_unified import Gemma4UnifiedImageProcessorTorch
from minivlm.inputs.video_patches import video_settings

PROCESSORS = {name: (f.config_class, f.processor_class) for name, f in FAMILIES.items() if f.processor_class}
OWN_IMAGE_PROCESSORS = {"gemma4_unified": Gemma4UnifiedImageProcessorTorch}  # transformers' needs torchvision


def register_processors():
    """Make AutoProcessor return the image-only processors (unregistered it returns a bare tokenizer)."""
    for config_class, processor_class in PROCESSORS.values():
        AutoProcessor.register(config_class, processor_class, exist_ok=True)


def saved_processor_fields(model_dir: str, processor_class) -> dict:
    """The processor's own named fields (image_seq_len, image_seq_length, ...) as the checkpoint saved them:
    processor_config.json, else preprocessor_config.json (older hub layout)."""
    named = set(inspect.signature(processor_class.__init__).parameters) - {"self", "image_processor", "tokenizer",
                                                                            "chat_template", "kwargs"}
    for name in ("processor_config.json", "preprocessor_config.json"):
        path = os.path.join(model_dir, name)
        if os.path.isfile(path):
            with open(path) as f:
                saved = json.load(f)
            fields = {k: saved[k] for k in named if k in saved}
            if fields:
                return fields
    return {}


def load_processor(model_dir: str, model_type: str):
    """The image-only processor of a checkpoint dir whatever its processor_class says; a tokenizer for text models."""
    family = get_family(model_type)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if family.processor_class is None:
        return tokenizer
    own = OWN_IMAGE_PROCESSORS.get(model_type)
    try:
        image_processor = own.from_pretrained(model_dir) if own else \
            AutoImageProcessor.from_pretrained(model_dir, backend="pil")
    except (OSError, ValueError, TypeError):
        if family.images != "patches":
            raise
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(model_dir)
    if family.images == "patches" and not isinstance(image_processor, Qwen2VLImageProcessorPil):
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(model_dir)
    chat_template = getattr(tokenizer, "chat_template", None)
    processor = family.processor_class(image_processor, tokenizer, chat_template=chat_template,
                                       **saved_processor_fields(model_dir, family.processor_class))
    processor.video_settings = video_settings(model_dir, model_type)  # None: this family takes no video
    return processor


register_processors()
