"""The independent truth: HF transformers' own model on the same checkpoint, teacher-forced, with the prompt
rendered by the checkpoint's processor and chat template through HF's own apply_chat_template (none of
minivlm's prompt building is used on this side)."""
import functools

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

from minivlm.inputs.processor import PROCESSORS, load_processor  # also registers the image-only processors (no torchvision needed)


TEXT_ONLY = ("qwen2", "qwen3")


def is_text_only(path: str) -> bool:
    return AutoConfig.from_pretrained(path).model_type in TEXT_ONLY


@functools.lru_cache(maxsize=8)
def hf_model(path: str, dtype: torch.dtype = torch.float32):
    auto = AutoModelForCausalLM if is_text_only(path) else AutoModelForImageTextToText
    return auto.from_pretrained(path, dtype=dtype).eval()


@functools.lru_cache(maxsize=8)
def hf_processor(path: str):
    if is_text_only(path):
        return AutoTokenizer.from_pretrained(path)
    model_type = AutoConfig.from_pretrained(path).model_type
    if model_type == "gemma4_unified":  # its image processor needs torchvision: minivlm's, checked against the stored
        return load_processor(path, model_type)  # output of transformers' own in test_gemma4_unified
    if model_type in PROCESSORS:  # transformers' processor minus its video slot (published configs name the full one)
        return PROCESSORS[model_type][1].from_pretrained(path)
    return AutoProcessor.from_pretrained(path)


def teacher_forced_logprobs(path: str, request, generated: list[int], dtype=torch.float32) -> torch.Tensor:
    """log-softmax (fp32) of HF's logits at each generated position, given prompt + generated tokens: [n, vocab]."""
    inputs = hf_processor(path).apply_chat_template(request.to_messages(), tokenize=True, return_dict=True,
                                                    add_generation_prompt=True, return_tensors="pt")
    n = inputs["input_ids"].shape[1]
    ids = torch.cat([inputs["input_ids"], torch.tensor([generated])], dim=1)
    kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
    for name in ("mm_token_type_ids", "token_type_ids"):  # Qwen-VL: mandatory with image_grid_thw; Gemma 3: its
        if name in inputs:                                   # images' tokens attend both ways by them
            kwargs[name] = torch.cat([inputs[name], torch.zeros(1, len(generated), dtype=torch.long)], dim=1)
    for name in ("image_grid_thw", "pixel_attention_mask", "image_position_ids"):  # Gemma 4: its patches' (x, y)
        if name in inputs:
            kwargs[name] = inputs[name]
    if "pixel_values" in inputs:
        kwargs["pixel_values"] = inputs["pixel_values"].to(dtype)
    with torch.no_grad():
        logits = hf_model(path, dtype)(**kwargs).logits[0].float()
    return torch.log_softmax(logits[n - 1:n - 1 + len(generated)], dim=-1)
