"""The engine's logprobs equal HF transformers' teacher-forced logprobs on the same checkpoint (fp32), and in
bf16 on CPU the engine is no further from HF fp32 than HF's own bf16 model is."""
import pytest
import torch
from PIL import Image

from minivlm import Engine, EngineConfig, Request, SamplingParams
from tests.conftest import FAMILIES
from tests.hf_reference import teacher_forced_logprobs


def scene(w, h, color):
    img = Image.new("RGB", (w, h), (230, 230, 230))
    img.paste(color, (w // 4, h // 4, w // 2, h // 2))
    return img


def requests():
    return [
        Request(prompt="What color is the shape?", images=[scene(100, 80, (220, 30, 30))]),
        Request(prompt="Describe the image.", images=[scene(180, 120, (40, 70, 220))]),
        Request(prompt="Hello, how are you?"),
        Request(prompt="How many shapes are there?", images=[scene(60, 90, (30, 170, 60)), scene(120, 64, (240, 210, 30))]),
        Request(messages=[{"role": "user", "content": [{"type": "image", "image": scene(90, 90, (140, 50, 180))},
                                                       {"type": "text", "text": "What shape is it?"}]},
                          {"role": "assistant", "content": "square"},
                          {"role": "user", "content": [{"type": "text", "text": "What color is the square?"}]}]),
    ]


def check_against_hf(path, family, request, out, tol=1e-4):
    ref = teacher_forced_logprobs(path, request, out.token_ids)
    for i, (tok, lp) in enumerate(zip(out.token_ids, out.logprobs)):
        assert abs(lp[tok] - ref[i, tok].item()) < tol, f"{family} token {i}: engine {lp[tok]} vs HF {ref[i, tok]}"
        top2 = ref[i].topk(2).values
        if (top2[0] - top2[1]).item() > 1e-4:  # greedy must pick HF's argmax except at exact near-ties
            assert tok == ref[i].argmax().item(), f"{family} token {i}: engine chose {tok}, HF argmax {ref[i].argmax()}"


@pytest.mark.parametrize("family", FAMILIES)
def test_single_requests_match_hf(family, checkpoints, engines):
    engine = engines[family]
    engine.reset_prefix_cache()
    for request in requests()[:3]:
        out = engine.generate(request, SamplingParams(max_tokens=12, ignore_eos=True, logprobs=1))
        assert len(out.token_ids) == 12
        check_against_hf(checkpoints[family], family, request, out)


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_requests_match_hf(family, checkpoints, engines):
    """Different image sizes, a text-only request, multi-image and multi-turn, all in one running batch."""
    engine = engines[family]
    engine.reset_prefix_cache()
    reqs = requests()
    outs = engine.generate(reqs, SamplingParams(max_tokens=10, ignore_eos=True, logprobs=3))
    for request, out in zip(reqs, outs):
        assert all(len(lp) >= 1 for lp in out.logprobs)
        check_against_hf(checkpoints[family], family, request, out)


def max_error(out, reference: torch.Tensor) -> float:
    """Largest |logprob - reference| over each generated position's reported tokens (top-k and the sampled one)."""
    return max(abs(v - reference[i, t].item()) for i, lp in enumerate(out.logprobs) for t, v in lp.items())


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_on_cpu_is_as_close_to_fp32_as_hf_bf16_is(family, checkpoints):
    path = checkpoints[family]
    with Engine(EngineConfig(model=path, dtype="bfloat16", device="cpu", num_blocks=128, max_model_len=1024)) as engine:
        reqs = requests()[:4]
        outs = engine.generate(reqs, SamplingParams(max_tokens=8, ignore_eos=True, logprobs=3))
    ours, theirs = [], []
    for request, out in zip(reqs, outs):
        fp32 = teacher_forced_logprobs(path, request, out.token_ids)
        ours.append(max_error(out, fp32))
        hf_bf16 = teacher_forced_logprobs(path, request, out.token_ids, dtype=torch.bfloat16)
        theirs.append(max(abs(hf_bf16[i, t] - fp32[i, t]).item() for i, lp in enumerate(out.logprobs) for t in lp))
    print(f"{family} bf16 max |Δlogprob| vs HF fp32: engine {max(ours):.4f}, HF bf16 {max(theirs):.4f}")
    assert max(ours) <= 1.5 * max(theirs), f"engine bf16 error {max(ours):.4f} vs HF bf16's {max(theirs):.4f}"
