"""Issue #40 item 9 (bf16 drift): in bf16 the engine's prompts run HF's arithmetic, in HF's order and dtypes, so on a
random checkpoint with Qwen2.5-VL-3B's text dimensions (hidden 2048, 16 heads, 2 KV heads, MLP 11008; 2 layers) and
ViT width (1280, 16 heads) its logprob error against HF fp32 is HF bf16's own error. Measured on the prompt's
positions (teacher-forced, the prefill's rows) and on greedy decode steps, over the whole vocabulary. On the CPU a
decode step reads the bf16 weights and pool in one C call with fp32 arithmetic inside (cpu_kernels/bf16_step.py),
so its rows err less than HF bf16's (this checkpoint: mean 0.0084 against 0.0101); the bound is the same.

What differed was the vision tower: load_module cast the whole module to bf16, so the ViT rotary's inv_freq (HF
keeps it fp32) was rounded, and every image embedding differed from HF bf16's. Since the tower is built in its dtype
as from_pretrained builds it, the prefill's logprobs are HF bf16's bit for bit (the bitwise test failed before: 68 of
72 prompt rows, max |Δ| 0.047). The error ratios pass on both sides of that fix (a rounded rotary hardly shows on
random weights): see bench/RESULTS.md "Issue #40 item 9", also for why the issue's 0.105 vs 0.080 is the noise of a
max over 32 chosen tokens."""
import os

import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file, save_file

from minivlm import Engine, EngineConfig, Request, SamplingParams
from tests.hf_reference import hf_model, hf_processor

pytestmark = pytest.mark.slow  # two 3B-wide checkpoints through the engine and HF in bf16 (~15 s): CI's -m slow
NEW_TOKENS = 8
# engine bf16 error / HF bf16 error vs HF fp32 on 4-layer 3B-dimension checkpoints, 7 seeds x 3 requests: prompt
# rows 1.000 (the same bits); decode rows' max over the vocabulary 0.88-1.04, mean 0.995-1.010; this checkpoint:
# prompt 1.000 max / 0.999 mean, decode 1.006 / 0.999. (The max at the chosen token alone, the measure,
# spread 0.51-1.45 over those runs: too noisy to test.)
MARGIN = 1.15


def scene(w, h, color):
    img = Image.new("RGB", (w, h), (230, 230, 230))
    img.paste(color, (w // 4, h // 4, w // 2, h // 2))
    return img


REQUEST = Request(prompt="Describe the image. What color is the shape?", images=[scene(224, 168, (40, 70, 220))])


def quiet_placeholders(path: str):
    """Greedy must never pick <|image_pad|> / <|video_pad|> (HF would count a generated one as an image token): their
    rows of the tied embedding are scaled to ~0, so their logit is ~0, never the top one. As inputs those rows are
    replaced by the tower's output anyway."""
    tokenizer = hf_processor(path).tokenizer
    file = os.path.join(path, "model.safetensors")
    state = load_file(file)
    table = next(k for k in state if k.endswith("embed_tokens.weight"))
    for token in ("<|image_pad|>", "<|video_pad|>"):
        state[table][tokenizer.convert_tokens_to_ids(token)] *= 1e-3
    save_file(state, file, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from tools.make_checkpoint import make_random_checkpoint
    path = make_random_checkpoint(
        "qwen2_5_vl", str(tmp_path_factory.mktemp("bf16") / "qwen2_5_vl_3b_dims"), seed=0, hidden=2048, layers=2,
        heads=16, kv_heads=2, head_dim=128, intermediate=11008, vision_depth=2, vision_hidden=1280, vision_heads=16,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]})
    quiet_placeholders(path)
    return path


def engine_bf16(path: str) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """Greedy tokens, the prefill's log-softmax on every prompt row [n, vocab] (the logits of the final norm's output,
    all rows, as HF's teacher-forced pass computes them) and each decode step's [NEW_TOKENS, vocab] (the lm_head's
    output: a decode step runs the bf16 C step, whose final norm is inside the call)."""
    steps, heads = [], []
    with Engine(EngineConfig(model=path, dtype="bfloat16", device="cpu", num_blocks=32, max_model_len=512)) as engine:
        decoder = engine.model.decoder
        head = decoder.lm_head  # the prompt's rows through its weight, not the module: its hook sees the engine's
        decoder.norm.register_forward_hook(lambda m, args, out: steps.append(F.linear(out, head.weight).float()))
        head.register_forward_hook(lambda m, args, out: heads.append(out.float()))
        out = engine.generate(REQUEST, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0))
    decode = torch.log_softmax(torch.cat([h[-1:] for h in heads[:NEW_TOKENS]]), dim=-1)
    # the hook saw the logits the engine sampled from: its reported logprobs are these rows
    assert all(abs(lp[t] - decode[i, t].item()) < 1e-6 for i, (t, lp) in enumerate(zip(out.token_ids, out.logprobs)))
    return out.token_ids, torch.log_softmax(steps[0], dim=-1), decode


def hf_logprobs(path: str, generated: list[int], dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    """HF's log-softmax on every row of prompt + generated [n + len, vocab] (row i predicts token i + 1) in one
    forward, and the prompt's length n; the prompt rendered by HF's own processor and chat template."""
    inputs = hf_processor(path).apply_chat_template(REQUEST.to_messages(), tokenize=True, return_dict=True,
                                                    add_generation_prompt=True, return_tensors="pt")
    ids = torch.cat([inputs["input_ids"], torch.tensor([generated], dtype=torch.long)], dim=1)
    types = torch.cat([inputs["mm_token_type_ids"], torch.zeros(1, len(generated), dtype=torch.long)], dim=1)
    with torch.no_grad():
        logits = hf_model(path, dtype)(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=types,
                                       pixel_values=inputs["pixel_values"].to(dtype),
                                       image_grid_thw=inputs["image_grid_thw"]).logits[0].float()
    return torch.log_softmax(logits, dim=-1), inputs["input_ids"].shape[1]


@pytest.fixture(scope="module")
def runs(checkpoint):
    """(prompt rows, decode rows) of each: the engine's bf16 run; HF fp32 and bf16 teacher-forced over its tokens; and
    HF bf16's forward over the prompt alone (the same rows as the engine's prefill: a matrix product's rounding may
    depend on how many rows it has)."""
    tokens, prompt, decode = engine_bf16(checkpoint)
    fp32, n = hf_logprobs(checkpoint, tokens, torch.float32)
    hf16, _ = hf_logprobs(checkpoint, tokens, torch.bfloat16)
    rows = slice(n - 1, n - 1 + len(tokens))
    return {"engine": (prompt, decode), "hf_bf16": (hf16[:n], hf16[rows]), "fp32": (fp32[:n], fp32[rows]),
            "hf_bf16_prefill": hf_logprobs(checkpoint, [], torch.bfloat16)[0]}


def test_bf16_logprob_error_is_hf_bf16s_own(runs):
    """max and mean |logprob - HF fp32| over the whole vocabulary: the engine's at most MARGIN x HF bf16's, on the
    prompt's rows and on the decode steps."""
    ref_prompt, ref_decode = runs["fp32"]
    for part, i, ref in (("prompt", 0, ref_prompt), ("decode", 1, ref_decode)):
        ours, theirs = (runs["engine"][i] - ref).abs(), (runs["hf_bf16"][i] - ref).abs()
        print(f"{part} ({len(ref)} rows): max |Δ| engine {ours.max():.4f}, HF bf16 {theirs.max():.4f}; "
              f"mean engine {ours.mean():.5f}, HF bf16 {theirs.mean():.5f}")
        assert ours.max() <= MARGIN * theirs.max(), f"{part}: max error {ours.max():.4f} vs HF's {theirs.max():.4f}"
        assert ours.mean() <= MARGIN * theirs.mean(), f"{part}: mean error {ours.mean():.5f} vs {theirs.mean():.5f}"


def test_bf16_prefill_is_hf_bf16_bit_for_bit(runs):
    """Same ops, same order, same dtypes, same shapes as HF's forward over the prompt: the prefill's logprobs are HF
    bf16's exactly (a cast or an order that differs anywhere, the vision tower included, shows here first)."""
    ours, theirs = runs["engine"][0], runs["hf_bf16_prefill"]
    rows = (ours != theirs).any(dim=-1).nonzero().flatten().tolist()
    assert not rows, f"{len(rows)} of {len(ours)} prompt rows differ from HF bf16's (first {rows[:4]}), max |Δ| " \
                     f"{(ours - theirs).abs().max():.4f}"
