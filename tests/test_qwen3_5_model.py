"""Qwen3.5's hybrid decoder (minivlm/model/qwen3_5.py) against transformers' Qwen3_5ForConditionalGeneration on the
same random checkpoint (tools/make_checkpoint_qwen3_5.py), fp32, max |Δ logprob| ≤ 1e-4. The engine's caches are
built here by hand, as the interface says the engine will: one K/V pool for the full-attention layers with
consecutive block tables, and zeroed state slots [num_slots, ...] for the Gated DeltaNet layers. Prompts go through
minivlm's input side (processor, M-RoPE positions, the vision tower); the truth is HF's own processor and model."""
import pytest
import torch
from PIL import Image
from transformers import Qwen3_5ForConditionalGeneration

from minivlm.config import EngineConfig
from minivlm.inputs.prompt import build_prompt
from minivlm.inputs.video_prompt import vision_runs
from minivlm.loader import LoadedModel
from minivlm.model.attention import AttentionMetadata
from minivlm.model.cache_spec import StateMetadata
from minivlm.model.qwen3_5 import Qwen3_5Decoder
from minivlm.model.rope import mrope_positions
from tests.hf_reference import hf_processor
from tools.make_checkpoint_qwen3_5 import make_qwen3_5_checkpoint
from tools.video_clips import moving_square

TOL = 1e-4
BLOCK, BLOCKS, SLOTS = 16, 64, 4
QUESTION = "Describe the image. What color is the shape? What shape is it? How many shapes are there? " * 2


def scene(w, h, color):
    img = Image.new("RGB", (w, h), (230, 230, 230))
    img.paste(color, (w // 4, h // 4, w // 2, h // 2))
    return img


IMAGE_CHAT = [{"role": "user", "content": [{"type": "image", "image": scene(200, 130, (220, 30, 30))},
                                           {"type": "text", "text": QUESTION}]}]
OTHER_QUESTION = [{"role": "user", "content": [{"type": "image", "image": scene(200, 130, (220, 30, 30))},
                                               {"type": "text", "text": QUESTION + "Where is it?"}]}]
TEXT_CHAT = [{"role": "user", "content": "Hello, how are you? The quick brown fox jumps over the lazy dog."}]
VIDEO_CHAT = [{"role": "user", "content": [{"type": "image", "image": scene(90, 60, (40, 70, 220))},
                                           {"type": "video", "video": moving_square(6, 56, 56, hue=90), "fps": 3},
                                           {"type": "text", "text": "What happens?"}]}]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return make_qwen3_5_checkpoint(str(tmp_path_factory.mktemp("qwen3_5") / "ckpt"), seed=3)


@pytest.fixture(scope="module")
def model(path):
    return LoadedModel(EngineConfig(model=path, device="cpu", dtype="float32"))


@pytest.fixture(scope="module")
def hf(path):
    return Qwen3_5ForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()


class Seq:
    """One sequence as the engine would hold it: its known tokens' embeddings and positions, its blocks, its slot."""

    def __init__(self, model, messages, table: list[int], slot: int):
        prompt = build_prompt(model.family, model.processor, messages, None, 4)
        self.ids, self.images = prompt.token_ids, prompt.images
        grids, scales = vision_runs(prompt.images)
        self.positions, self.delta = mrope_positions(prompt.token_types, grids, model.merge, scales)
        with torch.inference_mode():
            self.embeds = model.decoder.embed_tokens(torch.tensor(self.ids))
            if prompt.images:  # placeholder rows take the tower's outputs, images and videos in prompt order
                grid = torch.tensor([im.grid_thw for im in prompt.images])
                rows = torch.tensor(prompt.token_types) == 1
                self.embeds[rows] = torch.cat([e for e, _ in model.vision.encode(prompt.pixel_values, grid)])
        self.pixels, self.table, self.slot, self.done = prompt.pixel_values, table, slot, 0

    def append(self, model, token: int):
        """A generated token: its embedding, and position = its index + the rope delta on all three axes."""
        n = len(self.ids)
        self.ids.append(token)
        with torch.inference_mode():
            self.embeds = torch.cat([self.embeds, model.decoder.embed_tokens(torch.tensor([token]))])
        self.positions = torch.cat([self.positions, torch.full((3, 1), n + self.delta)], dim=1)


def empty_caches(decoder: Qwen3_5Decoder):
    """Per layer: the full-attention pool (K, V) or the DeltaNet's zeroed state slots, from layer_specs."""
    out = []
    for spec in decoder.layer_specs:
        if spec.kind == "recurrent":
            out.append(tuple(torch.zeros(SLOTS, *shape, dtype=spec.state_dtype) for shape in spec.state_shapes))
        else:
            out.append(tuple(torch.zeros(BLOCKS, BLOCK, spec.kv_heads, spec.head_dim) for _ in "kv"))
    return out


def step(model, caches, work: list[tuple[Seq, int]]) -> list[torch.Tensor]:
    """One engine step: each (sequence, n) computes its next n tokens, all flattened into one batch. Returns each
    sequence's log-softmax rows [n, vocab]."""
    embeds, positions, slot_mapping, q_lens, ctx_lens = [], [], [], [], []
    for seq, n in work:
        a, b = seq.done, seq.done + n
        embeds.append(seq.embeds[a:b])
        positions.append(seq.positions[:, a:b])
        slot_mapping += [seq.table[p // BLOCK] * BLOCK + p % BLOCK for p in range(a, b)]
        q_lens.append(n)
        ctx_lens.append(b)
    width = max(len(seq.table) for seq, _ in work)
    tables = torch.tensor([seq.table + [0] * (width - len(seq.table)) for seq, _ in work])
    metas = {"full_attention": AttentionMetadata.build(torch.tensor(slot_mapping), q_lens, ctx_lens, tables, BLOCK,
                                                       "cpu"),
             "recurrent": StateMetadata(torch.tensor([seq.slot for seq, _ in work]), q_lens, max(q_lens) > 1)}
    with torch.inference_mode():
        x = torch.cat(embeds)
        logits = model.decoder(x, torch.cat(positions, dim=1), caches, metas, last=torch.arange(x.shape[0]))
    for seq, n in work:
        seq.done += n
    return list(torch.log_softmax(logits.float(), dim=-1).split(q_lens))


def hf_logprobs(hf, path, messages) -> tuple[list[int], torch.Tensor]:
    """HF's processor on the messages (its own chat template and image processing), then its model over the whole
    prompt: (prompt ids, log-softmax of every row)."""
    inputs = hf_processor(path).apply_chat_template(messages, tokenize=True, return_dict=True,
                                                    add_generation_prompt=True, return_tensors="pt")
    with torch.no_grad():
        logits = hf(**inputs).logits
    return inputs["input_ids"][0].tolist(), torch.log_softmax(logits[0].float(), dim=-1)


def max_diff(got: torch.Tensor, ref: torch.Tensor) -> float:
    return (got - ref).abs().max().item()


def test_layer_specs_and_weights(model, path):
    """Three DeltaNet layers then one full-attention layer, from layer_types; the fp32 delta-rule state and the conv
    state as HF keeps them; load_weights skips transformers' ignored mtp.* keys and refuses others by name."""
    cfg = model.text_config
    specs = model.decoder.layer_specs
    assert [s.kind for s in specs] == ["recurrent"] * 3 + ["full_attention"]
    conv_dim = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + \
        cfg.linear_num_value_heads * cfg.linear_value_head_dim
    assert specs[0].state_shapes == ((conv_dim, cfg.linear_conv_kernel_dim - 1),
                                     (cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim))
    assert specs[0].state_dtype == torch.float32
    assert (specs[3].kv_heads, specs[3].head_dim) == (cfg.num_key_value_heads, cfg.head_dim)
    from minivlm.loader import load_state_dict, split_state_dict
    text, _ = split_state_dict(load_state_dict(path))

    def load(state):
        with torch.device("meta"):
            decoder = Qwen3_5Decoder("qwen3_5", cfg, False)
        decoder.load_weights(state, False, "cpu", torch.float32)
        return decoder
    decoder = load({**text, "mtp.fc.weight": torch.zeros(4, 4), "mtp.layers.0.mlp.up_proj.weight": torch.zeros(4)})
    assert torch.equal(decoder.layers[0].linear_attn.A_log, text["layers.0.linear_attn.A_log"])
    with pytest.raises(ValueError, match="unexpected.*layers.9.extra"):
        load({**text, "layers.9.extra.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="missing.*layers.1.linear_attn.in_proj"):
        load({k: v for k, v in text.items() if k != "layers.1.linear_attn.in_proj_a.weight"})


def test_prompt_and_positions_equal_transformers(model, hf, path):
    """minivlm's input side gives HF processor's prompt tokens, and get_rope_index's positions and delta, for an
    image, a text-only prompt, and an image + video (a timestamp before each frame pair)."""
    for messages in (IMAGE_CHAT, TEXT_CHAT):
        seq = Seq(model, messages, [], 0)
        inputs = hf_processor(path).apply_chat_template(messages, tokenize=True, return_dict=True,
                                                        add_generation_prompt=True, return_tensors="pt")
        assert seq.ids == inputs["input_ids"][0].tolist()
        pos, delta = hf.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                             inputs.get("image_grid_thw"))
        assert torch.equal(seq.positions, pos[:, 0]) and seq.delta == int(delta[0, 0])
    seq = Seq(model, VIDEO_CHAT, [], 0)
    video = next(im for im in seq.images if im.kind == "video")
    assert video.grid_thw[0] == 3 and video.video.frame_runs  # three frame pairs, each its own run
    ids, types, _ = video_inputs(model, seq)
    pos, delta = hf.model.get_rope_index(ids, types, torch.tensor([seq.images[0].grid_thw]),
                                         torch.tensor([video.grid_thw]))
    assert torch.equal(seq.positions, pos[:, 0]) and seq.delta == int(delta[0, 0])


def video_inputs(model, seq: Seq):
    """HF's inputs for minivlm's rendering of the image + video prompt: ids, token types (1 image, 2 video), the
    pixel rows of each."""
    image, video = seq.images
    ids = torch.tensor(seq.ids)
    types = (ids == model.hf_config.image_token_id).long() + 2 * (ids == model.hf_config.video_token_id).long()
    rows = seq.pixels.split([image.pixel_rows, video.pixel_rows])
    return ids[None], types[None], rows


def test_whole_prefill_equals_transformers(model, hf, path):
    """One image prompt (over 64 tokens: two of the delta rule's chunks) in one step."""
    seq = Seq(model, IMAGE_CHAT, list(range(8)), slot=2)
    assert len(seq.ids) > 64
    (got,) = step(model, empty_caches(model.decoder), [(seq, len(seq.ids))])
    ids, ref = hf_logprobs(hf, path, IMAGE_CHAT)
    assert seq.ids == ids and max_diff(got, ref) <= TOL


def test_video_prompt_equals_transformers(model, hf):
    """An image and a video (frame pairs between timestamps) through the tower and the decoder, vs HF's model on
    the same pixels (the video processor is Qwen3-VL's, compared to transformers' in tests/test_video.py)."""
    seq = Seq(model, VIDEO_CHAT, list(range(8)), slot=0)
    (got,) = step(model, empty_caches(model.decoder), [(seq, len(seq.ids))])
    ids, types, (image_rows, video_rows) = video_inputs(model, seq)
    with torch.no_grad():
        logits = hf(input_ids=ids, mm_token_type_ids=types, pixel_values=image_rows, pixel_values_videos=video_rows,
                    image_grid_thw=torch.tensor([seq.images[0].grid_thw]),
                    video_grid_thw=torch.tensor([seq.images[1].grid_thw])).logits
    assert max_diff(got, torch.log_softmax(logits[0].float(), dim=-1)) <= TOL


def test_two_sequences_in_one_batch(model, hf, path):
    """An image prompt and a shorter text-only one, each in its own slot and blocks, in one step."""
    a, b = Seq(model, IMAGE_CHAT, [5, 6, 7, 8, 9, 10, 11], slot=3), Seq(model, TEXT_CHAT, [1, 2], slot=1)
    assert len(a.ids) != len(b.ids)
    got_a, got_b = step(model, empty_caches(model.decoder), [(a, len(a.ids)), (b, len(b.ids))])
    assert max_diff(got_a, hf_logprobs(hf, path, IMAGE_CHAT)[1]) <= TOL
    assert max_diff(got_b, hf_logprobs(hf, path, TEXT_CHAT)[1]) <= TOL


def test_chunked_prefill_carries_the_state(model, hf, path):
    """A prefill split in two chunks (the second with ctx > q_len): the second reads the K/V pool and continues
    from the slot's conv and delta-rule states. Zeroing the slot between the chunks must show (the test can fail)."""
    _, ref = hf_logprobs(hf, path, IMAGE_CHAT)
    caches = empty_caches(model.decoder)
    seq = Seq(model, IMAGE_CHAT, list(range(8)), slot=1)
    first = step(model, caches, [(seq, 37)])[0]
    second = step(model, caches, [(seq, len(seq.ids) - 37)])[0]
    assert max_diff(torch.cat([first, second]), ref) <= TOL
    lost = Seq(model, IMAGE_CHAT, list(range(8, 16)), slot=0)
    step(model, caches, [(lost, 37)])
    for layer in caches[:3]:
        for t in layer:
            t[0].zero_()
    assert max_diff(step(model, caches, [(lost, len(lost.ids) - 37)])[0], ref[37:]) > 100 * TOL


def test_prefill_resumed_from_a_copied_state(model, hf, path):
    """A prefix-cache hit: sequence B shares A's first blocks (an image inside them) and starts from a copy of the
    state A's slot held after them, then computes only its own suffix."""
    caches = empty_caches(model.decoder)
    a = Seq(model, IMAGE_CHAT, list(range(8)), slot=0)
    b = Seq(model, OTHER_QUESTION, [], slot=2)
    common = next(i for i, (x, y) in enumerate(zip(a.ids, b.ids)) if x != y)
    k = common // BLOCK * BLOCK
    assert k >= BLOCK and a.images[0].end <= k  # the shared blocks hold the whole image
    step(model, caches, [(a, k)])
    for layer, spec in zip(caches, model.decoder.layer_specs):
        if spec.kind == "recurrent":
            for t in layer:
                t[b.slot] = t[a.slot]  # the engine's saved state, copied into B's slot
    b.table, b.done = a.table[:k // BLOCK] + list(range(20, 28)), k
    got_b, got_a = step(model, caches, [(b, len(b.ids) - k), (a, len(a.ids) - k)])
    assert max_diff(got_b, hf_logprobs(hf, path, OTHER_QUESTION)[1][k:]) <= TOL
    assert max_diff(got_a, hf_logprobs(hf, path, IMAGE_CHAT)[1][k:]) <= TOL  # A's own slot went on unharmed


def test_greedy_decode_equals_transformers_generate(model, hf, path):
    """Two sequences decoded together, one batch over their slots (the first decode beside the other's last prefill
    chunk, a mixed step), give HF generate's greedy tokens and its cached-decode logits at every step."""
    steps, caches = 5, empty_caches(model.decoder)
    a, b = Seq(model, IMAGE_CHAT, list(range(8)), slot=3), Seq(model, TEXT_CHAT, list(range(8, 12)), slot=0)
    prompt_lens, rows = {id(a): len(a.ids), id(b): len(b.ids)}, {id(a): [], id(b): []}

    def take(seq, out):  # greedy: the last row's argmax becomes the next token
        rows[id(seq)].append(out[-1])
        seq.append(model, int(out[-1].argmax()))
    take(a, step(model, caches, [(a, len(a.ids)), (b, 10)])[0])
    for seq, out in zip((a, b), step(model, caches, [(a, 1), (b, len(b.ids) - b.done)])):
        take(seq, out)
    while len(rows[id(b)]) < steps:
        live = [s for s in (a, b) if len(rows[id(s)]) < steps]
        for seq, out in zip(live, step(model, caches, [(s, 1) for s in live])):
            take(seq, out)
    for seq, messages in ((a, IMAGE_CHAT), (b, TEXT_CHAT)):
        inputs = hf_processor(path).apply_chat_template(messages, tokenize=True, return_dict=True,
                                                        add_generation_prompt=True, return_tensors="pt")
        with torch.no_grad():
            out = hf.generate(**inputs, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                              output_logits=True, return_dict_in_generate=True)
        assert seq.ids[prompt_lens[id(seq)]:] == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
        for got, logits in zip(rows[id(seq)], out.logits):
            assert max_diff(got, torch.log_softmax(logits[0].float(), dim=-1)) <= TOL


def test_engine_generates_what_transformers_generates(path, hf):
    """Through the engine (its KV-cache groups: the pool, the state slots, a saved state restored on a prefix hit),
    a batch of three and then a repeated request give HF generate's greedy tokens and logprobs. enforce_eager: the
    CPU backend's one-call C decode step is written for dense layers only."""
    from minivlm import Engine, Request, SamplingParams
    requests = [Request(messages=IMAGE_CHAT), Request(messages=TEXT_CHAT), Request(messages=OTHER_QUESTION)]
    params = SamplingParams(max_tokens=5, ignore_eos=True, logprobs=1)
    with Engine(EngineConfig(model=path, device="cpu", dtype="float32", num_blocks=64, max_model_len=512,
                             enforce_eager=True)) as engine:
        outs = engine.generate(requests, params)
        again = engine.generate([requests[2]], params)[0]
    assert again.num_cached_tokens >= BLOCK and again.token_ids == outs[2].token_ids
    for request, out in zip(requests + [requests[2]], outs + [again]):
        inputs = hf_processor(path).apply_chat_template(request.to_messages(), tokenize=True, return_dict=True,
                                                        add_generation_prompt=True, return_tensors="pt")
        with torch.no_grad():
            ref = hf.generate(**inputs, max_new_tokens=5, min_new_tokens=5, do_sample=False, output_logits=True,
                              return_dict_in_generate=True)
        assert out.token_ids == ref.sequences[0, inputs["input_ids"].shape[1]:].tolist()
        for token, logprobs, logits in zip(out.token_ids, out.logprobs, ref.logits):
            assert abs(logprobs[token] - torch.log_softmax(logits[0].float(), dim=-1)[token].item()) <= TOL
