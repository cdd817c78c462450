"""A follow-up turn reuses every full block it shares with the turn before, at every prompt length mod the block size,
with the chat templates' real behaviour: Qwen3.5 (recurrent state in 3 of 4 layers) with thinking on and off, whose
history drops what turn 1's generation prompt added, and Gemma 3 (sliding windows), whose history keeps it. The truth
is the two prompts' token ids (their common prefix, turn 1's computed tokens) against the engine's num_cached_tokens;
the tokens turn 2 generates from the cache equal those it generates with the cache reset."""
import shutil

import pytest

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.inputs.prompt import build_prompt

BS = 16

# Qwen3.5's published chat template (Qwen/Qwen3.5-* tokenizer_config.json "chat_template"), the parts a text chat
# uses: an assistant turn in the history keeps only what follows its reasoning (`content.split('</think>')[-1]`,
# newlines stripped); the generation prompt is `<|im_start|>assistant\n<think>\n` with thinking on (the default) and
# `<|im_start|>assistant\n<think>\n\n</think>\n\n` with enable_thinking=False. The engine passes no template kwargs,
# so each mode is its own template here. (The test checkpoint's tiny BPE splits <think> into pieces; the real
# vocabulary has it as one token: the engine counts whatever the tokenizer gives.)
QWEN3_5 = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{%- set c = m.content if m.content is string else m.content[0].text %}"
    "{{- '<|im_start|>assistant\\n' + c.split('</think>')[-1].lstrip('\\n') + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.content is string %}{{- m.content }}{%- else %}{%- for item in m.content %}"
    "{%- if item.type == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif item.type == 'text' %}{{- item.text }}{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' + GEN }}{%- endif %}")
THINKING = {"on": "'<think>\\n'", "off": "'<think>\\n\\n</think>\\n\\n'"}  # "kept": the checkpoint's own
# template, whose history keeps the generation prompt (`<|im_start|>assistant\n` + the answer): turn 2 shares all of
# turn 1's prompt and its answer, so it resumes from the state saved where the prompt ended or a decode reached


@pytest.fixture(scope="module")
def qwen3_5(tmp_path_factory):
    from tools.make_checkpoint_qwen3_5 import make_qwen3_5_checkpoint
    root = tmp_path_factory.mktemp("follow_up")
    base = make_qwen3_5_checkpoint(str(root / "base"), seed=3)
    out = {}
    for mode, gen in THINKING.items():
        path = root / f"thinking_{mode}"
        shutil.copytree(base, path)
        (path / "chat_template.jinja").write_text(QWEN3_5.replace("GEN", gen))
        out[mode] = str(path)
    out["kept"] = base
    return out


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    from tools.make_checkpoint_gemma3 import make_gemma3_checkpoint
    return make_gemma3_checkpoint(str(tmp_path_factory.mktemp("follow_up_gemma") / "gemma3"), seed=4)


def engine(path) -> Engine:
    return Engine(EngineConfig(model=path, device="cpu", dtype="float32", max_model_len=512, num_blocks=96))


def user(text):
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def ids(e, messages) -> list[int]:
    return build_prompt(e.model.family, e.processor, messages, None, 4).token_ids


def chats_at_every_residue(e):
    """A first user turn per prompt length mod BS (words added until every residue is met)."""
    found = {}
    for words in range(1, 200):
        messages = [user("Tell me about " + " ".join(["shapes"] * words) + ".")]
        found.setdefault(len(ids(e, messages)) % BS, messages)
        if len(found) == BS:
            return [found[r] for r in range(BS)]
    raise AssertionError(f"only residues {sorted(found)} met")


def common(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def check_follow_ups(e):
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    residues = set()
    for turn1 in chats_at_every_residue(e):
        first = e.generate(Request(messages=turn1), params)
        turn2 = turn1 + [{"role": "assistant", "content": [{"type": "text", "text": first.text}]},
                         user("And what colour are they?")]
        a, b = ids(e, turn1), ids(e, turn2)
        computed = a + list(first.token_ids[:-1])  # turn 1's tokens whose K/V (and states) exist
        shared = min(common(computed, b), len(b) - 1)  # a hit always leaves one token to compute
        second = e.generate(Request(messages=turn2), params)
        assert second.num_cached_tokens == shared // BS * BS, (len(a), shared, second.num_cached_tokens)
        residues.add(len(a) % BS)
        e.reset_prefix_cache()
        assert e.generate(Request(messages=turn2), params).token_ids == second.token_ids  # the cache changes nothing
    assert residues == set(range(BS))


@pytest.mark.parametrize("mode", ["on", "off", "kept"])
def test_qwen3_5_follow_up_reuses_every_shared_block_at_every_length(qwen3_5, mode):
    e = engine(qwen3_5[mode])
    check_follow_ups(e)
    states = next(g for g in e.memory_report().groups if g["kind"] == "recurrent")
    assert states["size"] > 0


def test_gemma3_follow_up_reuses_every_shared_block_at_every_length(gemma3):
    check_follow_ups(engine(gemma3))
