"""Checkpoint dir or hub id -> a LoadedModel: weights on the device, processor, tokenizer, end-of-turn ids."""
import glob
import importlib
import json
import os

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, GenerationConfig

from minivlm import checkpoint_check
from minivlm.config import EngineConfig
from minivlm.cpu_dtype import pick_cpu_dtype, saved_dtype
from minivlm.device import pick_device, pick_dtype
from minivlm.families import get_family
from minivlm.model import backends
from minivlm.model.decoder import Decoder
from minivlm.model.vision import VisionTower
from minivlm.model.vision_gemma3 import Gemma3VisionTower
from minivlm.model.vision_gemma4 import Gemma4VisionTower
from minivlm.model.vision_gemma4_unified import Gemma4UnifiedPatchEmbedder
from minivlm.model.vision_tiled import TiledVisionTower
from minivlm.inputs.processor import load_processor
FETCH_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "tokenizer*"]


def resolve_model_dir(model: str) -> str:
    """A local directory as is; anything else is a hub id fetched with huggingface-hub (clear error offline). Either
    way the directory is checked first (minivlm.checkpoint_check: tokenizer, chat template, processor, weights)."""
    if os.path.isdir(model):
        checkpoint_check.check_files(model)  # refused here, naming the missing file, before anything is released
        return model
    if os.path.exists(model):
        raise ValueError(f"model path {model!r} exists but is not a directory of an HF-format checkpoint")
    if model.count("/") != 1 or model.startswith((".", "/")):
        raise ValueError(f"model {model!r} is neither a local checkpoint directory nor a hub id like 'Qwen/Qwen2.5-VL-3B-Instruct'")
    from huggingface_hub import snapshot_download
    try:
        model_dir = snapshot_download(repo_id=model, allow_patterns=FETCH_PATTERNS)
    except Exception as e:  # offline, unknown repo, gated repo: all end here with one message
        raise ValueError(
            f"could not fetch model {model!r} from the Hugging Face hub ({type(e).__name__}: {e}). "
            f"On a machine with network run `huggingface-cli download {model} --local-dir <dir>` "
            f"and pass that directory as the model."
        ) from e
    checkpoint_check.check_files(model_dir)
    return model_dir


def read_model_type(model_dir: str) -> str:
    """The checkpoint's model_type, refused (saying why) unless it is a family minivlm runs."""
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path) as f:
            model_type = json.load(f).get("model_type")
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"checkpoint {model_dir!r} has no readable config.json: {e}") from e
    try:
        get_family(model_type)
    except ValueError as e:
        raise ValueError(f"{e} (read from {path})") from None
    return model_type


def load_state_dict(model_dir: str) -> dict[str, torch.Tensor]:
    """All safetensors shards of a checkpoint, merged into one dict."""
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise ValueError(f"checkpoint {model_dir!r} has no *.safetensors weights")
    state = {}
    for f in files:
        try:
            state.update(load_file(f))
        except Exception as e:
            raise ValueError(f"corrupt weights file {f!r}: {e}") from e
    return state


# where each family keeps its vision half: Qwen's "visual." prefix is dropped, the others' module names are kept
VISION_PREFIXES = ("visual.", "vision_model.", "connector.", "vision_tower.", "multi_modal_projector.", "embed_vision.",
                   "vision_embedder.")  # the last: Gemma 4 12B's patch embedder, as its checkpoints name it
UNSERVED_PREFIXES = ("audio_tower.", "embed_audio.")  # Gemma 4's audio half: audio input is refused, never run


def split_state_dict(state: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """Split into (text decoder, vision) dicts. Handles the 5.x layout (model.language_model.*), the older hub ones
    (model.layers.*; InternVL's language_model.model.* and language_model.lm_head) and text-only checkpoints; an
    audio tower's weights are left out."""
    text, vision = {}, {}
    for key, tensor in state.items():
        k = key.removeprefix("model.")
        if k.startswith(UNSERVED_PREFIXES):
            continue
        if k.startswith(VISION_PREFIXES):
            vision[k.removeprefix("visual.")] = tensor
        elif k.startswith(("language_model.", "text_model.")):
            text[k.split(".", 1)[1].removeprefix("model.")] = tensor
        else:
            text[k] = tensor  # lm_head.*, or the older layout: model.layers..., model.embed_tokens...
    return text, vision


def load_checkpoint(model: str):
    """Resolve, validate and read a checkpoint: returns (model_dir, model_type, config, processor, text, vision)."""
    model_dir = resolve_model_dir(model)
    model_type = read_model_type(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    processor = checkpoint_check.loading_processor(model_dir, lambda: load_processor(model_dir, model_type))
    checkpoint_check.check_loaded(model_dir, config, processor)  # transformers' empty tokenizer for a missing one
    text, vision = split_state_dict(load_state_dict(model_dir))
    return model_dir, model_type, config, processor, text, vision


def decoder_class(family) -> type:
    """The family's decoder: model/decoder.py's, or its own (a hybrid model's: minivlm.model.<module>.<Class>)."""
    if not family.decoder:
        return Decoder
    module, name = family.decoder.rsplit(".", 1)
    return getattr(importlib.import_module(f"minivlm.model.{module}"), name)


class LoadedModel:
    """One checkpoint on its device: decoder, vision tower, processor, tokenizer, end-of-turn ids. Read-only once
    built, so several engines (Engine.isolated) share one."""

    def __init__(self, config: EngineConfig):
        self.device = pick_device(config.device, config.model)
        self.model_dir, self.model_type, self.hf_config, self.processor, text_sd, vision_sd = load_checkpoint(config.model)
        self.model_id = config.model
        self.family = get_family(self.model_type)
        self.tokenizer = getattr(self.processor, "tokenizer", self.processor)  # a text model's processor is its tokenizer
        self.text_config = text_cfg = getattr(self.hf_config, "text_config", None) or self.hf_config
        self.dtype_reason = ""  # why dtype="auto" chose what it did on the CPU (the status line), else ""
        if config.dtype == "auto" and self.device.type == "cpu":  # the checkpoint's saved dtype (cpu_dtype.py)
            self.dtype, self.dtype_reason = pick_cpu_dtype(text_cfg, config.quantization,
                                                           saved_dtype(self.hf_config, text_sd))
        else:
            self.dtype = pick_dtype(config.dtype, self.device)
        self.dtype_name = str(self.dtype).removeprefix("torch.")
        tied = bool(getattr(self.hf_config, "tie_word_embeddings", False) or getattr(text_cfg, "tie_word_embeddings", False))
        with torch.device("meta"):  # no random init of weights we are about to overwrite
            self.decoder = decoder_class(self.family)(self.model_type, text_cfg, tied)
        if hasattr(self.decoder, "placeholder_ids"):  # Gemma 4: the tokens that embed as the pad token (HF does)
            ids = (getattr(self.hf_config, f"{m}_token_id", None) for m in ("image", "video", "audio"))
            self.decoder.placeholder_ids = tuple(i for i in ids if i is not None)
        if getattr(config.speculative_config, "method", None) != "mtp" and hasattr(self.decoder, "drop_mtp"):
            self.decoder.drop_mtp()  # a multi-token-prediction head is loaded only to draft with (vLLM's "mtp")
        self.decoder.load_weights(text_sd, tied, self.device, self.dtype)
        self.decoder.eval()
        self.quantization = config.quantization
        if config.quantization:  # weight-only int8 / int4 through PyTorch's kernels (model/backends/quantized.py)
            n = backends.quantized.quantize(self.decoder, config.quantization, self.device, self.dtype)
            padded = len(backends.quantized.padded_layers(self.decoder))  # widths PyTorch's kernels do not take
            self.linear_backend = backends.Said("engine.linear_quantized_padded" if padded else "engine.linear_quantized",
                                                method=config.quantization, n=n, padded=padded)
            backends.prepare_linears(self.decoder, self.device, self.dtype, small_batches=True)  # the rest: lm_head
        else:  # the device's linear layers, once (the CPU's kernels start compiling here, while the rest loads)
            self.linear_backend = backends.prepare_linears(self.decoder, self.device, self.dtype, small_batches=True)
        self.vision = self._vision(vision_sd)
        if self.vision is not None:
            backends.prepare_linears(self.vision.module, self.device, self.dtype)
        self.merge = getattr(getattr(self.hf_config, "vision_config", None), "spatial_merge_size", 1)
        self.eos_ids = self._eos_ids()

    def _vision(self, vision_sd: dict):
        """The family's vision half (None for a text model)."""
        if self.family.images == "none":
            if vision_sd:
                raise ValueError(f"text-only checkpoint {self.model_dir!r} has vision weights: {sorted(vision_sd)[:3]}")
            return None
        if self.family.images == "patches":
            return VisionTower(self.model_type, self.hf_config.vision_config, vision_sd, self.device, self.dtype)
        if self.family.images == "fixed":
            return Gemma3VisionTower(self.hf_config, vision_sd, self.device, self.dtype)
        if self.model_type == "gemma4_unified":  # no encoder: merged patches through norms and one linear
            return Gemma4UnifiedPatchEmbedder(self.hf_config, vision_sd, self.device, self.dtype)
        if self.family.images == "budget":
            return Gemma4VisionTower(self.hf_config, vision_sd, self.device, self.dtype)
        return TiledVisionTower(self.model_type, self.hf_config, vision_sd, self.device, self.dtype)

    def _eos_ids(self) -> set[int]:
        """Every id that ends a turn: config, tokenizer and generation_config.json may each name some."""
        try:
            generation_eos = GenerationConfig.from_pretrained(self.model_dir).eos_token_id
        except OSError:
            generation_eos = None
        ids = set()
        for v in (getattr(self.text_config, "eos_token_id", None), getattr(self.hf_config, "eos_token_id", None),
                  self.tokenizer.eos_token_id, generation_eos):
            ids.update(v if isinstance(v, (list, tuple)) else [v] if v is not None else [])
        return ids

    def weights_bytes(self) -> int:
        params = {id(p): p for p in self.decoder.parameters()}  # tied embeddings count once
        return sum(p.numel() * p.element_size() for p in params.values()) + (self.vision.num_bytes() if self.vision else 0) \
            + backends.quantized.quantized_bytes(self.decoder)

    def weight_copies_bytes(self) -> int:
        """The decoder's dense copies of packed weights, kept for gemv.c (CPU fp32 decode of a few sequences)."""
        return sum(m.dense.numel() * m.dense.element_size() for m in self.decoder.modules()
                   if getattr(m, "dense", None) is not None)
