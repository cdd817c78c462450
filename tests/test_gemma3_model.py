"""Gemma 3's hybrid decoder (minivlm/model/gemma3.py), its vision half and input side against transformers'
Gemma3ForConditionalGeneration on the same random checkpoint (tools/make_checkpoint_gemma3.py: five sliding layers
with a 24-token window, then a global one), fp32, max |Δ logprob| ≤ 1e-4. The engine's caches are built here by
hand, as the interface says the engine will: one pool per cache kind with its own block tables (the sliding pool's
blocks in another order), image runs as bidirectional spans. HF gets its processor's token_type_ids, so it applies
its own bidirectional image mask; every prompt outgrows the window."""
import pytest
import torch
from PIL import Image
from transformers import Gemma3ForConditionalGeneration
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

from minivlm import Engine, Request
from minivlm.config import EngineConfig
from minivlm.inputs.image_layout import runs
from minivlm.inputs.prompt import build_prompt
from minivlm.loader import LoadedModel
from minivlm.model.attention import AttentionMetadata
from minivlm.model.gemma3 import Gemma3Decoder, inverse_frequencies
from tools.make_checkpoint_gemma3 import SLIDING_WINDOW, build_gemma3, make_gemma3_checkpoint
from tools.tiny_tokenizer import family_tokenizer

TOL = 1e-4
BLOCK, BLOCKS = 8, 96
QUESTION = "Describe the image. What color is the shape? What shape is it? How many shapes are there?"


def scene(w, h, color):
    img = Image.new("RGB", (w, h), (230, 230, 230))
    img.paste(color, (w // 4, h // 4, w // 2, h // 2))
    return img


def chat(*images, text=QUESTION):
    return [{"role": "user", "content": [*({"type": "image", "image": im} for im in images),
                                         {"type": "text", "text": text}]}]


IMAGE_CHAT = chat(scene(200, 130, (220, 30, 30)))
TWO_IMAGES = chat(scene(90, 60, (40, 70, 220)), scene(48, 160, (30, 200, 60)), text=QUESTION + " Where is it?")
PANORAMA = chat(scene(640, 256, (200, 160, 20)))  # wide enough for pan-and-scan's 256-px crops: the image + 2 crops
TEXT_CHAT = [{"role": "user", "content": "Hello, how are you? The quick brown fox jumps over the lazy dog. " * 2}]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return make_gemma3_checkpoint(str(tmp_path_factory.mktemp("gemma3") / "ckpt"), seed=5)


@pytest.fixture(scope="module")
def model(path):
    return LoadedModel(EngineConfig(model=path, device="cpu", dtype="float32"))


@pytest.fixture(scope="module")
def hf(path):
    return Gemma3ForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()


class Seq:
    """One sequence as the engine holds it: its tokens, image rows, spans, and its blocks in each cache kind."""

    def __init__(self, model, messages, mm_kwargs=None):
        self.prompt = build_prompt(model.family, model.processor, messages, mm_kwargs, 4)
        self.ids, self.types = list(self.prompt.token_ids), list(self.prompt.token_types)
        self.spans = runs(self.types)
        self.image_rows = None
        if self.prompt.images:
            views = [im.pixel_rows for im in self.prompt.images]
            self.image_rows = torch.cat([e for e, _ in model.vision.encode(self.prompt.pixel_values, (views, None))])
        self.tables = {}


FREED = 1  # the sliding tables' placeholder for a block that left the window (block 0 pads the tables)


class Paged:
    """Hand-built caches: per layer a (K, V) pool of its kind; per kind a free list (the sliding one reversed, so the
    two kinds' tables differ), blocks given to a sequence as its tokens reach them."""

    def __init__(self, decoder):
        self.kinds = [s.kind for s in decoder.layer_specs]
        self.window = next(s.window for s in decoder.layer_specs if s.window)
        self.caches = [tuple(torch.zeros(BLOCKS, BLOCK, s.kv_heads, s.head_dim) for _ in "kv")
                       for s in decoder.layer_specs]
        self.free = {"full_attention": list(range(2, BLOCKS)), "sliding_window": list(range(BLOCKS - 1, 1, -1))}

    def reach(self, seq, end):
        for kind, free in self.free.items():
            table = seq.tables.setdefault(kind, [])
            while len(table) * BLOCK < end:
                table.append(free.pop(0))

    def metas(self, work):
        q_lens, ctx = [b - a for _, a, b in work], [b for _, _, b in work]
        out = {}
        for kind in self.free:
            tables = [s.tables[kind] for s, _, _ in work]
            width = max(map(len, tables))
            padded = torch.tensor([t + [0] * (width - len(t)) for t in tables])
            slots = torch.tensor([s.tables[kind][p // BLOCK] * BLOCK + p % BLOCK
                                  for s, a, b in work for p in range(a, b)])
            out[kind] = AttentionMetadata.build(slots, q_lens, ctx, padded, BLOCK, "cpu",
                                                window=self.window if kind == "sliding_window" else None,
                                                spans=[[sp for sp in s.spans if sp[1] > a and sp[0] < b]
                                                       for s, a, b in work])
        return out


def step(model, paged, work) -> torch.Tensor:
    """One engine step over [(seq, start, end)]: the log-probabilities after each sequence's last token [B, V]."""
    dec = model.decoder
    for seq, _, end in work:
        paged.reach(seq, end)
    ids = torch.tensor([t for s, a, b in work for t in s.ids[a:b]])
    positions = torch.cat([torch.arange(a, b) for _, a, b in work]).expand(3, -1)
    with torch.inference_mode():
        embeds = dec.embed_tokens(ids)
        row = 0
        for s, a, b in work:  # image placeholders take their rows of the tower's output, as the runner does
            for p in range(a, b):
                if p < len(s.types) and s.types[p]:  # generated tokens are text
                    embeds[row + p - a] = s.image_rows[sum(s.types[:p])]
            row += b - a
        last = torch.tensor([b - a for _, a, b in work]).cumsum(0) - 1
        logits = dec(embeds, positions, paged.caches, paged.metas(work), last=last)
    return logits.double().log_softmax(-1)


def hf_logprobs(hf, seq, upto=None) -> torch.Tensor:
    """HF's teacher-forced log-probabilities after every token of seq.ids (prompt + known continuation) [n, V]."""
    n = len(seq.ids)
    types = torch.tensor(seq.types + [0] * (n - len(seq.types)))[None]
    with torch.inference_mode():
        out = hf(input_ids=torch.tensor(seq.ids)[None], pixel_values=seq.prompt.pixel_values, token_type_ids=types)
    return out.logits[0].double().log_softmax(-1)


def hf_generate(hf, seq, n: int):
    """HF's own cached greedy decode of n tokens: (tokens, log-probabilities of each step [n, V])."""
    pixels = {} if seq.prompt.pixel_values is None else {"pixel_values": seq.prompt.pixel_values}
    with torch.inference_mode():
        out = hf.generate(input_ids=torch.tensor(seq.ids)[None], token_type_ids=torch.tensor(seq.types)[None],
                          max_new_tokens=n, min_new_tokens=n, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, **pixels)
    return out.sequences[0, len(seq.ids):].tolist(), torch.cat(out.logits).double().log_softmax(-1)


def gap(a, b) -> float:
    return float((a - b).abs().max())


def test_input_side_marks_only_the_soft_tokens_as_hf_does(model):
    """Prompt tokens and types equal the processor's input_ids and token_type_ids (its soft tokens, not boi/eoi);
    pan-and-scan: one image owns its view and its crops' runs, 16 soft tokens each."""
    for messages, kw in ((TWO_IMAGES, None), (PANORAMA, {"do_pan_and_scan": True})):
        seq = Seq(model, messages, kw)
        text = model.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        images = [c["image"] for m in messages for c in m["content"] if c["type"] == "image"]
        out = model.processor(text=[text], images=images, add_special_tokens=False, return_tensors="pt", **(kw or {}))
        assert seq.ids == out["input_ids"][0].tolist() and seq.types == out["token_type_ids"][0].tolist()
        assert torch.equal(seq.prompt.pixel_values, out["pixel_values"])
        views = [im.pixel_rows for im in seq.prompt.images]
        assert views == ([1, 1] if kw is None else [3]) and len(seq.spans) == sum(views)
        assert all(b - a == 16 for a, b in seq.spans)
    assert seq.prompt.images[0].tiles == (1, 2)


def test_anatomy_lays_out_each_view_as_a_pooled_grid(path, model):
    """The anatomy of a pan-and-scan request: the processor's soft tokens are the image tokens, each of the image's
    three views a 4x4 grid in prompt order (view 0 the whole image), 1-D positions."""
    with Engine(EngineConfig(model=path, device="cpu", dtype="float32", num_blocks=32)) as engine:
        a = engine.anatomy(Request(messages=PANORAMA, mm_processor_kwargs={"do_pan_and_scan": True}))
    seq = Seq(model, PANORAMA, {"do_pan_and_scan": True})
    assert [int(t.type == "image") for t in a.tokens] == seq.types and a.images_as == "fixed"
    cells = [(t.image_index, t.tile, t.grid_row, t.grid_col) for t in a.tokens if t.type == "image"]
    assert cells == [(0, v, r, c) for v in range(3) for r in range(4) for c in range(4)]
    assert all(t.position == (t.index,) * 3 for t in a.tokens)
    (image,) = a.images
    assert (image.tiles, image.tokens_per_tile, image.num_tokens, image.merge_size) == ((1, 2), 16, 48, 2)


def test_vision_half_equals_hf(model, hf):
    seq = Seq(model, PANORAMA, {"do_pan_and_scan": True})
    with torch.inference_mode():
        want = hf.model.get_image_features(seq.prompt.pixel_values).pooler_output.reshape(-1, 64)
    assert gap(seq.image_rows, want) < 1e-5


def test_whole_prefill_then_decode_equals_hf(model, hf):
    """One sequence: its prompt in one step, then decode steps fed HF's own greedy tokens; every step's log-probs
    against HF's cached generate, and the prompt's against HF's teacher-forced forward."""
    paged, seq = Paged(model.decoder), Seq(model, IMAGE_CHAT)
    assert len(seq.ids) > 2 * SLIDING_WINDOW
    tokens, want = hf_generate(hf, seq, 5)
    got = [step(model, paged, [(seq, 0, len(seq.ids))])[0]]
    assert gap(got[0], hf_logprobs(hf, seq)[-1]) < TOL
    for t in tokens[:-1]:
        seq.ids.append(t)
        got.append(step(model, paged, [(seq, len(seq.ids) - 1, len(seq.ids))])[0])
    assert gap(torch.stack(got), want) < TOL
    assert [int(g.argmax()) for g in got] == tokens


def test_two_sequences_in_one_batch_then_batched_decodes(model, hf):
    """Two images of different sizes in one prompt beside a text-only prompt of another length, one prefill step,
    then decodes of both together; the sliding pool's blocks that left the window are poisoned (NaN) and their
    table entries point at a NaN block, so any read of them would show."""
    paged = Paged(model.decoder)
    seqs = [Seq(model, TWO_IMAGES), Seq(model, TEXT_CHAT)]
    gens = [hf_generate(hf, s, 4) for s in seqs]
    got = step(model, paged, [(s, 0, len(s.ids)) for s in seqs])
    for s, g, (_, want) in zip(seqs, got, gens):
        assert gap(g, want[0]) < TOL
    for i in range(3):
        for s, (tokens, _) in zip(seqs, gens):
            s.ids.append(tokens[i])
            poison_left_window(paged, s)
        got = step(model, paged, [(s, len(s.ids) - 1, len(s.ids)) for s in seqs])
        for s, g, (_, want) in zip(seqs, got, gens):
            assert gap(g, want[i + 1]) < TOL


def poison_left_window(paged, seq):
    """Blocks of seq's sliding table wholly older than the next query's window: NaN, and in the table the FREED
    placeholder (NaN too)."""
    table, oldest = seq.tables["sliding_window"], len(seq.ids) - paged.window
    for j in range(max(0, oldest) // BLOCK):
        for i, kind in enumerate(paged.kinds):
            if kind == "sliding_window":
                for cache in paged.caches[i]:
                    cache[[table[j], FREED]] = float("nan")
        table[j] = FREED


def test_chunked_prefill_and_a_mixed_step(model, hf):
    """A prompt in two chunks split between its images (the second chunk reads the first from both pools) while
    another sequence decodes in the same step (the mixed step's parts), and a pan-and-scan prompt's three runs."""
    paged = Paged(model.decoder)
    a, b = Seq(model, TWO_IMAGES), Seq(model, PANORAMA, {"do_pan_and_scan": True})
    cut = (a.spans[0][1] + a.spans[1][0]) // 2
    first = step(model, paged, [(a, 0, cut), (b, 0, len(b.ids) - 1)])
    assert gap(first[0], hf_logprobs(hf, a)[cut - 1]) < TOL  # text before an image never sees it
    (tokens_b, want_b) = hf_generate(hf, b, 1)
    got = step(model, paged, [(a, cut, len(a.ids)), (b, len(b.ids) - 1, len(b.ids))])
    assert gap(got[0], hf_logprobs(hf, a)[-1]) < TOL
    assert gap(got[1], want_b[0]) < TOL


def test_prefix_hit_inside_an_image_span(model, hf):
    """A second request of the same prompt shares the first one's blocks up to a block boundary inside the image:
    its chunk starts mid-span and must still see the whole span (the earlier half from the cache) both ways."""
    paged = Paged(model.decoder)
    first, second = Seq(model, IMAGE_CHAT), Seq(model, IMAGE_CHAT)
    step(model, paged, [(first, 0, len(first.ids))])
    a, b = first.spans[0]
    hit = (a // BLOCK + 1) * BLOCK
    assert a < hit < b
    for kind, table in first.tables.items():
        second.tables[kind] = table[:hit // BLOCK]
    got = step(model, paged, [(second, hit, len(second.ids))])[0]
    assert gap(got, hf_logprobs(hf, second)[-1]) < TOL
    with pytest.raises(ValueError, match="inside the bidirectional span"):  # a chunk may not end inside one
        step(model, Paged(model.decoder), [(Seq(model, IMAGE_CHAT), 0, hit)])


def test_softcapping_settings_are_read_as_hf_reads_them(tmp_path):
    """Gemma3ForConditionalGeneration applies neither attn_logit_softcapping nor final_logit_softcapping (transformers
    5.x passes no softcap to its attention, and only Gemma3ForCausalLM caps logits): set, they change nothing here
    either."""
    path = make_gemma3_checkpoint(str(tmp_path / "capped"), seed=6, attn_logit_softcapping=1.0,
                                  final_logit_softcapping=0.5)
    model = LoadedModel(EngineConfig(model=path, device="cpu", dtype="float32"))
    hf = Gemma3ForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    seq = Seq(model, TEXT_CHAT)
    got = step(model, Paged(model.decoder), [(seq, 0, len(seq.ids))])[0]
    assert gap(got, hf_logprobs(hf, seq)[-1]) < TOL


def test_a_bad_pan_and_scan_knob_is_refused(model):
    with pytest.raises(ValueError, match="'do_pan_and_scan' must be true or false"):
        Seq(model, PANORAMA, {"do_pan_and_scan": "yes"})
    with pytest.raises(ValueError, match="allowed: do_pan_and_scan"):
        Seq(model, PANORAMA, {"max_patches": 2})


@pytest.mark.parametrize("rope", [{"rope_type": "default", "rope_theta": 1e6},
                                  {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}])
def test_both_ropes_have_hf_frequencies(rope):
    _, config, _ = build_gemma3(family_tokenizer("gemma3"), full_rope=rope)
    text = config.text_config
    hf_rope = Gemma3RotaryEmbedding(text)
    for kind in ("full_attention", "sliding_attention"):
        assert torch.equal(inverse_frequencies(text, kind), getattr(hf_rope, f"{kind}_inv_freq"))


def test_unsupported_settings_are_refused_by_name():
    tokenizer = family_tokenizer("gemma3")
    for rope, word in (({"rope_type": "yarn", "factor": 8.0, "rope_theta": 1e6}, "yarn"),):
        _, config, _ = build_gemma3(tokenizer, full_rope=rope)
        with pytest.raises(ValueError, match=word), torch.device("meta"):
            Gemma3Decoder("gemma3", config.text_config, True)
    _, config, _ = build_gemma3(tokenizer, hidden_activation="silu")
    with pytest.raises(ValueError, match="hidden_activation"), torch.device("meta"):
        Gemma3Decoder("gemma3", config.text_config, True)
