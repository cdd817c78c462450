"""Checkpoint dir or hub id -> (transformers config, image-only processor, state dicts for text and vision)."""
import glob
import json
import os

import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from minivlm.processor import PROCESSORS, load_processor

SUPPORTED = tuple(PROCESSORS)  # qwen2_vl, qwen2_5_vl, qwen3_vl
FETCH_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "tokenizer*"]


def resolve_model_dir(model: str) -> str:
    """A local directory as is; anything else is a hub id fetched with huggingface-hub (clear error offline)."""
    if os.path.isdir(model):
        return model
    if os.path.exists(model):
        raise ValueError(f"model path {model!r} exists but is not a directory of an HF-format checkpoint")
    if model.count("/") != 1 or model.startswith((".", "/")):
        raise ValueError(f"model {model!r} is neither a local checkpoint directory nor a hub id like 'Qwen/Qwen2.5-VL-3B-Instruct'")
    from huggingface_hub import snapshot_download
    try:
        return snapshot_download(repo_id=model, allow_patterns=FETCH_PATTERNS)
    except Exception as e:  # offline, unknown repo, gated repo: all end here with one message
        raise ValueError(
            f"could not fetch model {model!r} from the Hugging Face hub ({type(e).__name__}: {e}). "
            f"On a machine with network run `huggingface-cli download {model} --local-dir <dir>` "
            f"and pass that directory as the model."
        ) from e


def read_model_type(model_dir: str) -> str:
    """The checkpoint's model_type, refused unless it is a Qwen-VL family we run."""
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path) as f:
            model_type = json.load(f).get("model_type")
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"checkpoint {model_dir!r} has no readable config.json: {e}") from e
    if model_type not in SUPPORTED:
        raise ValueError(f"unsupported architecture {model_type!r} in {path}; minivlm runs {', '.join(SUPPORTED)}")
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


def split_state_dict(state: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """Split into (text decoder, vision tower) dicts; handles both the 5.x and the older hub key layouts."""
    text, vision = {}, {}
    for key, tensor in state.items():
        k = key[len("model."):] if key.startswith("model.") else key
        if k.startswith("visual."):
            vision[k[len("visual."):]] = tensor
        elif k.startswith("language_model."):
            text[k[len("language_model."):]] = tensor
        elif key.startswith("lm_head."):
            text[key] = tensor
        else:
            text[k] = tensor  # older layout: model.layers..., model.embed_tokens...
    return text, vision


def load_checkpoint(model: str):
    """Resolve, validate and read a checkpoint: returns (model_dir, model_type, config, processor, text, vision)."""
    model_dir = resolve_model_dir(model)
    model_type = read_model_type(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    processor = load_processor(model_dir, model_type)
    text, vision = split_state_dict(load_state_dict(model_dir))
    return model_dir, model_type, config, processor, text, vision
