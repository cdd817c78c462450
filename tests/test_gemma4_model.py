"""Gemma 4 (minivlm/model/gemma4.py, gemma4_layers.py, vision_gemma4.py) served by the engine against transformers'
Gemma4ForConditionalGeneration on the same random checkpoint (tests/gemma4_requests.py), fp32. Each engine output's
tokens and top-5 logprobs are checked against HF's teacher-forced log-probabilities over the prompt HF's own processor
renders (tests/hf_reference.py): max |Δ| <= TOL, single and batched, with images, on a prefix-cache repeat, with
16-token chunks, in a 10-block pool that preempts."""
from contextlib import nullcontext

import pytest
import torch

from minivlm import Engine, EngineConfig, Request
from tests.gemma4_requests import (BLOCK, TEXT, TOL, TWO, WIDE, ask, bf16_gaps, engine, gap_to_hf, greedy,  # noqa: F401
                                   path, scene, served)
from tools.make_checkpoint_gemma4 import SLIDING_WINDOW, make_gemma4_checkpoint


def test_an_image_request_equals_hf(path, served):
    with nullcontext(served) as e:  # the module's engine
        out = e.generate(WIDE, greedy(8))
    assert out.num_prompt_tokens > SLIDING_WINDOW + 60  # the window slid past the image
    assert gap_to_hf(path, WIDE, out) <= TOL


def test_a_batch_and_its_prefix_cache_repeat_equal_hf(path, served):
    """Three requests in one batch (two images of other sizes, text only), then the image one again: served from
    the prefix cache (sliding and full blocks), the same answer."""
    with nullcontext(served) as e:  # the module's engine
        outs = e.generate([WIDE, TWO, TEXT], greedy())
        again = e.generate(WIDE, greedy())
    for request, out in zip((WIDE, TWO, TEXT), outs):
        assert gap_to_hf(path, request, out) <= TOL
    assert again.num_cached_tokens >= (outs[0].num_prompt_tokens // BLOCK - 1) * BLOCK
    assert again.token_ids == outs[0].token_ids and gap_to_hf(path, WIDE, again) <= TOL


def test_turn_two_with_a_new_image_reuses_every_full_block_it_shares_and_equals_hf(path, served):
    """A chat's second turn (turn 1, its answer, a new image and question): its hit is every full block of the
    longest token prefix it shares with what turn 1 computed (the sliding window before it still cached), and its
    answer equals HF's."""
    first = WIDE.to_messages()
    with nullcontext(served) as e:  # the module's engine
        one = e.generate(WIDE, greedy())
        new = [{"type": "image", "image": scene(90, 60, (40, 70, 220))}, {"type": "text", "text": "And this one?"}]
        two = Request(messages=first + [{"role": "assistant", "content": one.text}, {"role": "user", "content": new}])
        before = e.anatomy(WIDE).tokens
        after = e.anatomy(two).tokens
        out = e.generate(two, greedy())
    computed = [t.token_id for t in before] + one.token_ids[:-1]  # the last answer token's K/V were never written
    shared = next((i for i, (a, b) in enumerate(zip(computed, [t.token_id for t in after])) if a != b),
                  min(len(computed), len(after)))
    assert shared >= one.num_prompt_tokens  # turn 1 whole (a random answer's text may tokenize anew)
    assert out.num_cached_tokens == shared // BLOCK * BLOCK
    assert gap_to_hf(path, two, out) <= TOL


def test_the_shared_layers_read_their_sources_and_the_checkpoints_kv_weights_are_unread(path, served):
    """Layers 6-9 compute no K/V: 6-8 read layer 5 (the last sliding layer before them), 9 reads layer 4 (the last
    full one); the k_proj / v_proj / k_norm the checkpoint carries for them (random) load nowhere."""
    from safetensors import safe_open
    with nullcontext(served) as e:  # the module's engine
        decoder = e.model.decoder
        assert decoder.sources == [0, 1, 2, 3, 4, 5, 5, 5, 5, 4]
        assert [s.head_dim for s in decoder.layer_specs[:6]] == [12, 12, 12, 12, 20, 12]
        assert [(s.kind, s.source) for s in decoder.layer_specs[6:]] == [("kv_shared", 5)] * 3 + [("kv_shared", 4)]
        for i in range(6, 10):
            attn = decoder.layers[i].self_attn
            assert attn.qkv_proj.out_features == 4 * attn.head_dim and not hasattr(attn, "k_norm")
    with safe_open(f"{path}/model.safetensors", "pt") as f:
        assert "model.language_model.layers.9.self_attn.k_proj.weight" in f.keys()


def test_the_per_layer_embeddings_read_the_ids_the_forward_is_given(served):
    """The token ids reach the decoder as its forward's input_ids (every family's forward takes them; the runner
    passes the step's): without them, or with a count that is not embeds' rows, Gemma 4's decoder refuses."""
    decoder = served.model.decoder
    ids = torch.tensor([2, 10, 11])
    embeds, positions = decoder.embed_tokens(ids), torch.arange(3).expand(3, 3)
    for given in (None, ids[:2]):
        with pytest.raises(ValueError, match="per-layer embeddings read the step's token ids: pass input_ids"):
            decoder(embeds, positions, None, {}, input_ids=given)
    assert not torch.equal(decoder.per_layer_inputs(ids, embeds), decoder.per_layer_inputs(ids + 1, embeds))


@pytest.mark.slow
def test_sixteen_token_chunks_equal_hf(path):
    with engine(path, enable_chunked_prefill=True, max_num_batched_tokens=16) as e:
        outs = e.generate([WIDE, TWO], greedy())
    for request, out in zip((WIDE, TWO), outs):
        assert gap_to_hf(path, request, out) <= TOL


@pytest.mark.slow
def test_a_ten_block_pool_preempts_and_still_equals_hf(path):
    """An image request (6 blocks of 16) and a text one (2) fit 10 blocks at admission, not once each has decoded
    30 tokens: the newest is preempted, recomputed, and both equal HF."""
    a = ask(scene(60, 60, (220, 30, 30)), text="Colour?")
    b = Request(messages=[{"role": "user", "content": "Hello, how are you? The quick brown fox jumps."}])
    with Engine(EngineConfig(model=path, device="cpu", dtype="float32", block_size=16, num_blocks=10,
                             max_model_len=160)) as e:
        outs = e.generate([a, b], greedy(30))
        kinds = [ev.kind for ev in e.events()]
    assert "preempted" in kinds
    for request, out in zip((a, b), outs):
        assert gap_to_hf(path, request, out) <= TOL


@pytest.mark.slow
def test_images_attending_both_ways_on_sliding_layers_equal_hf_in_16_token_chunks(tmp_path):
    """use_bidirectional_attention='vision' (the larger Gemma 4s): an image's tokens see each other both ways on the
    sliding layers only (full layers stay causal); in 16-token chunks no chunk ends inside the image. HF's own
    logits change when it is not told where the image is, so the both-ways mask is really exercised."""
    from tests.hf_reference import hf_model, hf_processor
    bidir = make_gemma4_checkpoint(str(tmp_path / "bidir"), seed=7, use_bidirectional_attention="vision")
    with engine(bidir, enable_chunked_prefill=True, max_num_batched_tokens=16) as e:
        out = e.generate(WIDE, greedy())
    assert gap_to_hf(bidir, WIDE, out) <= TOL
    inputs = hf_processor(bidir).apply_chat_template(WIDE.to_messages(), tokenize=True, return_dict=True,
                                                     add_generation_prompt=True, return_tensors="pt")
    with torch.no_grad():
        told = hf_model(bidir)(**inputs).logits
        inputs.pop("mm_token_type_ids")
        causal = hf_model(bidir)(**inputs).logits
    assert (told - causal).abs().max() > 1e-3


@pytest.mark.slow
def test_bf16_errs_as_hf_bf16_does(path):
    """In bf16 the engine's top-5 logprobs differ from HF fp32's by what HF bf16's differ (measured: ratio 0.90-1.00
    on these three requests; bound 1.15, tests/test_bf16_drift.py's margin)."""
    for request in (WIDE, TWO, TEXT):
        ours, theirs = bf16_gaps(path, request)
        assert ours <= 1.15 * theirs, (ours, theirs)


@pytest.mark.slow
def test_full_layers_whose_keys_are_their_values_equal_hf(tmp_path):
    """attention_k_eq_v (the larger Gemma 4s): full layers project K once and use it as V too, with their own KV head
    count (num_global_key_value_heads 1 here); the full group's pool is sized by it."""
    keqv = make_gemma4_checkpoint(str(tmp_path / "keqv"), seed=3, attention_k_eq_v=True, num_global_key_value_heads=1)
    with engine(keqv) as e:
        out = e.generate(WIDE, greedy())
        full = e.memory_report().groups[0]
    assert gap_to_hf(keqv, WIDE, out) <= TOL
    assert full["kind"] == "full_attention" and full["bytes"] == 2 * 96 * BLOCK * 1 * 20 * 4


def test_unsupported_settings_are_refused_by_name():
    from transformers import Gemma4TextConfig

    from minivlm.model.gemma4 import Gemma4Decoder
    moe = Gemma4TextConfig(num_hidden_layers=2, enable_moe_block=True, num_experts=4, top_k_experts=2,
                           moe_intermediate_size=8, layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(ValueError, match=r"enable_moe_block=True, num_experts=4 \(a mixture-of-experts block"):
        Gemma4Decoder("gemma4", moe, True)
    both = Gemma4TextConfig(num_hidden_layers=2, use_bidirectional_attention="all",
                            layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(ValueError, match="use_bidirectional_attention='all'"):
        Gemma4Decoder("gemma4", both, True)


@pytest.mark.slow
def test_hf_agrees_the_window_matters(path):
    """A sanity check on the reference itself: HF's logits for the long text prompt change if the sliding window is
    widened past it (so a decoder that ignored the window would fail the tests above)."""
    from transformers import Gemma4ForConditionalGeneration
    wide = Gemma4ForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([[2] + list(range(10, 80))])
    with torch.no_grad():
        narrow_logits = wide(input_ids=ids).logits
        for layer in wide.model.language_model.layers:
            if layer.self_attn.sliding_window:
                layer.self_attn.sliding_window = 10_000
        wide.config.text_config.sliding_window = 10_000
        wide_logits = wide(input_ids=ids).logits
    assert (narrow_logits - wide_logits).abs().max() > 1e-3
