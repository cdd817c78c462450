"""The independent truth: HF transformers' own model on the same checkpoint, teacher-forced."""
import functools

import torch
from transformers import AutoModelForImageTextToText

from minivlm.multimodal import build_prompt
from minivlm.processor import load_processor


@functools.lru_cache(maxsize=8)
def hf_model(path: str):
    return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()


def teacher_forced_logprobs(path: str, model_type: str, request, generated: list[int]) -> torch.Tensor:
    """log-softmax of HF's logits at each generated position, given prompt + generated tokens: [n, vocab]."""
    processor = load_processor(path, model_type)
    prompt = build_prompt(processor, request.to_messages(), request.mm_processor_kwargs, 16)
    ids = torch.tensor([prompt.token_ids + generated])
    types = torch.tensor([prompt.token_types + [0] * len(generated)])
    kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=types)
    if prompt.images:
        kwargs.update(pixel_values=prompt.pixel_values, image_grid_thw=torch.tensor([im.grid_thw for im in prompt.images]))
    with torch.no_grad():
        logits = hf_model(path)(**kwargs).logits[0].float()
    n = len(prompt.token_ids)
    return torch.log_softmax(logits[n - 1:n - 1 + len(generated)], dim=-1)
