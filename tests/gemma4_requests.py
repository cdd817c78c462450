"""What tests/test_gemma4_model.py and test_gemma4_serving.py share: the random Gemma 4 checkpoint
(tools/make_checkpoint_gemma4.py: ten layers, the last four reading earlier layers' K/V, sliding head 12 / full head
20, per-layer embeddings, a 24-token window that every prompt outgrows), one engine of it per test module, the
requests they send, and the gap of an engine output to HF's teacher-forced log-probabilities."""
import pytest
import torch
from PIL import Image

from minivlm import Engine, EngineConfig, Request, SamplingParams
from tests.hf_reference import teacher_forced_logprobs
from tools.make_checkpoint_gemma4 import make_gemma4_checkpoint

TOL = 1e-5  # the measured gap: at most 2e-6 (fp32, the requests below)
BLOCK = 8
QUESTION = "Describe the image. What color is the shape? What shape is it? How many shapes are there?"


def scene(w, h, color):
    img = Image.new("RGB", (w, h), (230, 230, 230))
    img.paste(color, (w // 4, h // 4, w // 2, h // 2))
    return img


def ask(*images, text=QUESTION, **kw) -> Request:
    return Request(messages=[{"role": "user", "content": [*({"type": "image", "image": im} for im in images),
                                                          {"type": "text", "text": text}]}], **kw)


WIDE = ask(scene(200, 130, (220, 30, 30)))                                  # 60 soft tokens
TWO = ask(scene(90, 60, (40, 70, 220)), scene(48, 160, (30, 200, 60)), text=QUESTION + " Where is it?")
TEXT = Request(messages=[{"role": "user", "content": "Hello, how are you? The quick brown fox jumps over the lazy "
                                                     "dog. " * 3}])


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return make_gemma4_checkpoint(str(tmp_path_factory.mktemp("gemma4") / "ckpt"), seed=5)


@pytest.fixture(scope="module")
def served(path):
    """One engine of the default settings for the module's tests (each test a fresh one where it sets others)."""
    with engine(path) as e:
        yield e


def engine(path, **kw) -> Engine:
    return Engine(EngineConfig(model=path, device="cpu", dtype=kw.pop("dtype", "float32"), block_size=BLOCK,
                               num_blocks=kw.pop("num_blocks", 96), max_model_len=kw.pop("max_model_len", 512), **kw))


def greedy(n: int = 6) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, logprobs=5)


def gap_to_hf(path, request, out) -> float:
    """The engine's tokens must be HF's argmax at each position; returns max |Δ| over each step's top-5 logprobs."""
    ref = teacher_forced_logprobs(path, request, out.token_ids)
    assert ref.argmax(-1).tolist() == out.token_ids
    assert all(len(d) >= 5 for d in out.logprobs)
    return max(abs(ref[i, t].item() - lp) for i, d in enumerate(out.logprobs) for t, lp in d.items())


def bf16_gaps(path, request) -> tuple[float, float]:
    """The bf16 engine's answer: max |Δ| of its top-5 logprobs from HF fp32's, and HF bf16's own max |Δ| there."""
    with engine(path, dtype="bfloat16") as e:
        out = e.generate(request, greedy(8))
    fp32 = teacher_forced_logprobs(path, request, out.token_ids, torch.float32)
    bf16 = teacher_forced_logprobs(path, request, out.token_ids, torch.bfloat16)
    pairs = [(i, t, lp) for i, d in enumerate(out.logprobs) for t, lp in d.items()]
    return (max(abs(lp - fp32[i, t].item()) for i, t, lp in pairs),
            max(abs(bf16[i, t].item() - fp32[i, t].item()) for i, t, _ in pairs))
