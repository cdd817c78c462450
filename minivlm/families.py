"""Every model family minivlm runs, and every fact that differs between them, in one registry: how an image becomes
tokens (Qwen's native-resolution patches, or tiles plus a global view), positions (M-RoPE or 1-D), the decoder's
attention details (looked up by the text model's own model_type), and the processor knobs a request may set."""
from dataclasses import dataclass

from transformers.models.gemma3 import Gemma3Config, Gemma3Processor
from transformers.models.gemma4 import Gemma4Config, Gemma4Processor
from transformers.models.gemma4_unified import Gemma4UnifiedConfig, Gemma4UnifiedProcessor
from transformers.models.idefics3 import Idefics3Config, Idefics3Processor
from transformers.models.internvl import InternVLConfig, InternVLProcessor
from transformers.models.qwen2 import Qwen2Config
from transformers.models.qwen2_5_vl import Qwen2_5_VLConfig, Qwen2_5_VLProcessor
from transformers.models.qwen2_vl import Qwen2VLConfig, Qwen2VLProcessor
from transformers.models.qwen3 import Qwen3Config
from transformers.models.qwen3_5 import Qwen3_5Config
from transformers.models.qwen3_vl import Qwen3VLConfig, Qwen3VLProcessor
from transformers.models.smolvlm import SmolVLMConfig, SmolVLMProcessor
from transformers.processing_utils import ProcessorMixin


class VideoExpanded:
    """minivlm expands a video's tokens itself (minivlm.inputs.video_prompt), so they reach the processor already in
    place, with no video for it to process: its count check must not see them."""

    def validate_inputs(self, images=None, text=None, videos=None, audio=None, **kwargs):
        if text is not None and videos is None and getattr(self, "video_token", None):
            text = [t.replace(self.video_token, "") for t in ([text] if isinstance(text, str) else text)]
        return super().validate_inputs(images=images, text=text, videos=videos, audio=audio, **kwargs)


class Qwen2VLImageOnlyProcessor(VideoExpanded, Qwen2VLProcessor):
    """Qwen2-VL processor for images and text only (no video processor, so no torchvision)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


class Qwen2_5_VLImageOnlyProcessor(VideoExpanded, Qwen2_5_VLProcessor):
    """Qwen2.5-VL processor for images and text only."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


class Qwen3VLImageOnlyProcessor(VideoExpanded, Qwen3VLProcessor):
    """Qwen3-VL processor for images and text only."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


class Qwen3_5ImageOnlyProcessor(Qwen3VLImageOnlyProcessor):
    """Qwen3.5 processor for images and text only (transformers serves qwen3_5 with Qwen3-VL's processor)."""


class Gemma3ImageOnlyProcessor(Gemma3Processor):
    """Gemma 3 processor; image_seq_length named so from_pretrained passes the checkpoint's value."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, image_seq_length: int = 256,
                 **kwargs):
        super().__init__(image_processor, tokenizer, chat_template=chat_template, image_seq_length=image_seq_length,
                         **kwargs)


class ImagesAndTextOnly(ProcessorMixin):
    """Placed between a processor that hands ProcessorMixin every sub-processor by name (Gemma 4's) and
    ProcessorMixin: only the image processor and the tokenizer are kept (a video processor needs torchvision; audio
    is refused, so no feature extractor)."""

    def __init__(self, *args, image_processor=None, tokenizer=None, chat_template=None, feature_extractor=None,
                 video_processor=None, **kwargs):
        super().__init__(image_processor, tokenizer, chat_template=chat_template, **kwargs)


class Gemma4ImageOnlyProcessor(Gemma4Processor, ImagesAndTextOnly):
    """Gemma 4 processor for images and text; image_seq_length named so from_pretrained passes the checkpoint's."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, image_seq_length: int = 280,
                 **kwargs):
        super().__init__(None, image_processor, tokenizer, None, chat_template=chat_template,
                         image_seq_length=image_seq_length, **kwargs)


class Gemma4UnifiedImageOnlyProcessor(Gemma4UnifiedProcessor, ImagesAndTextOnly):
    """Gemma 4 12B's processor for images and text; minivlm.inputs.processor gives it minivlm's plain-torch image
    processor (transformers' exists only on torchvision), so build it with load_processor, not from_pretrained."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, image_seq_length: int = 280,
                 **kwargs):
        super().__init__(None, image_processor, tokenizer, None, chat_template=chat_template,
                         image_seq_length=image_seq_length, **kwargs)


class SmolVLMImageOnlyProcessor(SmolVLMProcessor):
    """SmolVLM2 processor for images and text only. image_seq_len is named so from_pretrained passes the
    checkpoint's value (ProcessorMixin passes only named parameters; a missing one would silently default to 169)."""

    def __init__(self, image_processor=None, tokenizer=None, image_seq_len: int = 169, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, image_seq_len=image_seq_len, chat_template=chat_template,
                         **kwargs)

    def apply_chat_template(self, conversation, chat_template=None, **kwargs):
        # SmolVLMProcessor's own version reads video sampling defaults from the (absent) video processor
        return ProcessorMixin.apply_chat_template(self, conversation, chat_template, **kwargs)


class InternVLImageOnlyProcessor(InternVLProcessor):
    """InternVL processor for images and text only; image_seq_length named for the same reason as above."""

    def __init__(self, image_processor=None, tokenizer=None, image_seq_length: int = 256, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, image_seq_length=image_seq_length,
                         chat_template=chat_template, **kwargs)


@dataclass(frozen=True)
class Family:
    """One model family: how its images become tokens, its positions, the processor knobs a request may set."""
    model_type: str                 # config.json's model_type
    title: str
    config_class: type
    processor_class: type | None    # the image-only processor; None: a text model (tokenizer only)
    images: str                     # "patches" (Qwen native resolution) | "tiles" (crops + global view) |
                                    # "fixed" (Gemma 3: mm_tokens_per_image per image or pan-and-scan crop) |
                                    # "budget" (Gemma 4: resized to fit a soft-token budget, patches pooled k x k) |
                                    # "none"
    mrope: bool                     # 3-axis M-RoPE positions (else 1-D: every axis the same counter)
    knobs: tuple[str, ...] = ()     # mm_processor_kwargs a request may set
    tiling: str = ""                # tiles: "grid" (SmolVLM: max_image_size tiles + a global view, <row_i_col_j>
                                    # markers) or "crops" (InternVL: closest-aspect-ratio crops + a thumbnail)
    deepstack: bool = False         # ViT layer features added to the first decoder layers' image rows
    interleaved_mrope: bool = False  # t/h/w frequencies interleaved (else contiguous chunks; a config flag may override)
    decoder: str = ""               # a decoder of its own ("module.Class" in minivlm.model); "" = model/decoder.py's


@dataclass(frozen=True)
class DecoderFacts:
    """Attention details of a text decoder, by the text config's model_type (None: read attention_bias)."""
    qk_norm: bool                   # RMSNorm on q and k per head
    qkv_bias: bool | None
    o_bias: bool | None


QWEN_KNOBS = ("min_pixels", "max_pixels")
FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("qwen2_vl", "Qwen2-VL", Qwen2VLConfig, Qwen2VLImageOnlyProcessor, "patches", True, QWEN_KNOBS),
    Family("qwen2_5_vl", "Qwen2.5-VL", Qwen2_5_VLConfig, Qwen2_5_VLImageOnlyProcessor, "patches", True, QWEN_KNOBS),
    Family("qwen3_vl", "Qwen3-VL", Qwen3VLConfig, Qwen3VLImageOnlyProcessor, "patches", True, QWEN_KNOBS,
           deepstack=True, interleaved_mrope=True),
    Family("qwen3_5", "Qwen3.5", Qwen3_5Config, Qwen3_5ImageOnlyProcessor, "patches", True, QWEN_KNOBS,
           interleaved_mrope=True, decoder="qwen3_5.Qwen3_5Decoder"),
    Family("gemma3", "Gemma 3", Gemma3Config, Gemma3ImageOnlyProcessor, "fixed", False, ("do_pan_and_scan",),
           decoder="gemma3.Gemma3Decoder"),
    Family("gemma4", "Gemma 4", Gemma4Config, Gemma4ImageOnlyProcessor, "budget", False, ("max_soft_tokens",),
           decoder="gemma4.Gemma4Decoder"),
    Family("gemma4_unified", "Gemma 4 12B", Gemma4UnifiedConfig, Gemma4UnifiedImageOnlyProcessor, "budget", False,
           ("max_soft_tokens",), decoder="gemma4.Gemma4Decoder"),
    Family("smolvlm", "SmolVLM2", SmolVLMConfig, SmolVLMImageOnlyProcessor, "tiles", False,
           ("do_image_splitting", "max_image_size", "size"), tiling="grid"),
    Family("idefics3", "Idefics3 (SmolVLM)", Idefics3Config, Idefics3Processor, "tiles", False,
           ("do_image_splitting", "max_image_size", "size"), tiling="grid"),
    Family("internvl", "InternVL3 / 3.5", InternVLConfig, InternVLImageOnlyProcessor, "tiles", False,
           ("max_patches", "min_patches", "crop_to_patches"), tiling="crops"),
    Family("qwen2", "Qwen2 / Qwen2.5 (text)", Qwen2Config, None, "none", False),
    Family("qwen3", "Qwen3 (text)", Qwen3Config, None, "none", False),
)}
QWEN_VL = tuple(name for name, f in FAMILIES.items() if f.images == "patches" and not f.decoder)  # Qwen2/2.5/3-VL

DECODERS: dict[str, DecoderFacts] = {
    "qwen2_vl": DecoderFacts(False, True, False), "qwen2_5_vl": DecoderFacts(False, True, False),
    "qwen2": DecoderFacts(False, True, False),
    "qwen3_vl": DecoderFacts(True, None, None), "qwen3": DecoderFacts(True, None, None),
    "llama": DecoderFacts(False, None, None),
}

# Architectures people bring that a paged attention cache cannot hold, and why (the refusal says it).
REFUSED = {
    "qwen3_5_moe": "a mixture-of-experts decoder (minivlm's decoder has dense MLPs only)",
    "qwen3_next": "a mixture-of-experts decoder with Gated DeltaNet layers (minivlm's hybrid decoders have dense MLPs; "
                  "Qwen3.5 runs)",
    "gemma4_assistant": "Gemma 4's drafter (gemma4_assistant) is a speculative-decoding draft model, not a model to "
                        "serve on its own",
    "qwen3_vl_moe": "a mixture-of-experts decoder (minivlm's decoder has dense MLPs only)",
    "qwen3_moe": "a mixture-of-experts decoder (minivlm's decoder has dense MLPs only)",
    "gemma3_text": "Gemma 3's text-only checkpoints (1B) are not wired in yet; the multimodal gemma3 ones run",
}


def get_family(model_type: str) -> Family:
    """The family of a config's model_type, or a clear error naming the ones minivlm runs (and why not this one)."""
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    why = f": {REFUSED[model_type]}" if model_type in REFUSED else ""
    raise ValueError(f"unsupported architecture {model_type!r}{why}. minivlm runs {', '.join(FAMILIES)} "
                     f"(Qwen-VL, Qwen3.5, Gemma 3/4, SmolVLM2/Idefics3, InternVL3/3.5, and text-only Qwen2/Qwen3)")


def decoder_facts(text_model_type: str) -> DecoderFacts:
    text_model_type = text_model_type.removesuffix("_text")  # a Qwen-VL text config says e.g. qwen3_vl_text
    if text_model_type not in DECODERS:
        raise ValueError(f"unsupported text decoder {text_model_type!r}; minivlm's decoder runs {', '.join(DECODERS)}")
    return DECODERS[text_model_type]
