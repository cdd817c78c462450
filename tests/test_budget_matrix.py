"""The calculator over the model matrix (SmolVLM2, InternVL3.5, text-only Qwen2.5 / Qwen3) against independent truths:
transformers' own image processors and prompt builders on real images, models built on the meta device, KV caches
transformers really fills, and the parameter counts the model publishers state."""
import random
import re
from types import SimpleNamespace

import pytest
import torch
from PIL import Image
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
from transformers.models.got_ocr2 import GotOcr2ImageProcessorPil
from transformers.models.internvl.processing_internvl import InternVLProcessor
from transformers.models.smolvlm import SmolVLMImageProcessorPil
from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

from minivlm.budget import (TEXT_ONLY, estimate, gpus_needed, hf_config, image_plan, load_model_preset,
                            model_preset_names, model_shape, parameter_count, vision_params, vision_tokens)

SMOLVLM = ["SmolVLM2-256M-Video-Instruct", "SmolVLM2-500M-Video-Instruct", "SmolVLM2-2.2B-Instruct"]
INTERNVL = ["InternVL3_5-1B-HF", "InternVL3_5-2B-HF", "InternVL3_5-4B-HF", "InternVL3_5-8B-HF"]
QWEN_TEXT = ["Qwen2.5-0.5B-Instruct", "Qwen2.5-1.5B-Instruct", "Qwen2.5-3B-Instruct", "Qwen2.5-7B-Instruct",
             "Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B"]
NEW = SMOLVLM + INTERNVL + QWEN_TEXT
# Totals the publishers state, in billions, as rounded there (model cards; OpenGVLab's InternVL3.5 table; the
# SmolVLM2 names): the count must round to the same figure.
PUBLISHED_B = {"Qwen2.5-0.5B-Instruct": "0.49", "Qwen2.5-1.5B-Instruct": "1.54", "Qwen2.5-3B-Instruct": "3.09",
               "Qwen2.5-7B-Instruct": "7.61", "Qwen3-0.6B": "0.6", "Qwen3-1.7B": "1.7", "Qwen3-4B": "4.0",
               "Qwen3-8B": "8.2", "InternVL3_5-1B-HF": "1.1", "InternVL3_5-2B-HF": "2.3", "InternVL3_5-4B-HF": "4.7",
               "InternVL3_5-8B-HF": "8.5", "SmolVLM2-256M-Video-Instruct": "0.256",
               "SmolVLM2-500M-Video-Instruct": "0.51", "SmolVLM2-2.2B-Instruct": "2.2"}
# Image sizes (height, width): tiny, thin strips both ways, tile edges, common photos, huge; plus random ones.
SIZES = [(4, 4), (33, 47), (100, 100), (224, 1000), (1000, 224), (10, 3000), (3000, 12), (383, 385), (448, 448),
         (449, 449), (511, 512), (513, 512), (512, 1537), (600, 800), (768, 1024), (1080, 1920), (1920, 1080),
         (2048, 2047), (2160, 3840), (3000, 4000), (4000, 1000), (5000, 5000), (6000, 800)]


def sizes(seed: int, n: int = 8) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return SIZES + [(rng.randint(4, 5000), rng.randint(4, 5000)) for _ in range(n)]


def smolvlm_processor(preset: str, **fast) -> SmolVLMImageProcessorPil:
    """transformers' SmolVLM image processor with the checkpoint's published settings."""
    p = load_model_preset(preset)["_processor"]
    return SmolVLMImageProcessorPil(size=p["size"], max_image_size=p["max_image_size"],
                                    do_image_splitting=p["do_image_splitting"], return_row_col_info=True, **fast)


# ---- vision tokens: each family's tiling against its own processor -------------------------------------------------
@pytest.mark.parametrize("preset", SMOLVLM)
def test_smolvlm_tokens_equal_the_processors_tiles_and_prompt(preset):
    image_seq_len = load_model_preset(preset)["_processor"]["image_seq_len"]
    planner = smolvlm_processor(preset)
    # the real preprocessing on every size for the smallest tile (its slow part is the resize; nearest is as exact
    # for the shapes), on a few for the others; the processor's own patch count on all
    fast = smolvlm_processor(preset, resample=0, do_rescale=False, do_normalize=False, do_pad=False)
    real = sizes(len(preset)) if preset == SMOLVLM[0] else SIZES[::5] if preset == SMOLVLM[2] else []  # 500M: as 256M
    for h, w in sizes(len(preset), n=30):
        plan = image_plan(preset, h, w)
        num, rows, cols = planner.get_number_of_image_patches(h, w)
        if (h, w) in real:
            out = fast(images=[Image.new("RGB", (w, h))])
            assert (out["rows"][0][0], out["cols"][0][0]) == (rows, cols), (h, w)
            assert len(out["pixel_values"][0]) == plan.tiles, (h, w)
        assert plan.tiles == (num or 1), (h, w)
        prompt = get_image_prompt_string(rows, cols, image_seq_len, "<fake_token_around_image>", "<image>",
                                         "<global-img>")
        assert plan.vision_tokens == prompt.count("<image>") == vision_tokens(h, w, preset), (h, w)
        markers = prompt.replace("<image>", "")
        specials = markers.count("<fake_token_around_image>") + markers.count("<global-img>") + markers.count("<row_")
        assert plan.marker_tokens == specials + len(re.findall("\n+", markers)), (h, w)  # a newline run: 1 token


@pytest.mark.parametrize("preset", INTERNVL)
def test_internvl_tokens_equal_the_processors_patches_and_prompt(preset):
    p = load_model_preset(preset)["_processor"]
    processor = GotOcr2ImageProcessorPil(size=p["size"], crop_to_patches=p["crop_to_patches"],
                                         min_patches=p["min_patches"], max_patches=p["max_patches"], resample=0,
                                         do_rescale=False, do_normalize=False)
    prompt_of = SimpleNamespace(start_image_token="<img>", end_image_token="</img>", image_token="<IMG_CONTEXT>",
                                image_seq_length=p["image_seq_length"])
    for h, w in sizes(len(preset) * 7):
        num = processor.get_number_of_image_patches(h, w)
        if preset == INTERNVL[0]:  # the four share these settings: the real crop once, the processor's count on all
            assert num == int(processor(images=[Image.new("RGB", (w, h))])["num_patches"][0]), (h, w)
        plan = image_plan(preset, h, w)
        prompt = InternVLProcessor.replace_image_token(prompt_of, {"num_patches": [num]}, 0)
        assert plan.tiles == num and plan.vision_tokens == prompt.count("<IMG_CONTEXT>"), (h, w)
        assert plan.tokens == 2 + p["image_seq_length"] * num  # InternVLProcessor._get_num_multimodal_tokens
        assert plan.marker_tokens == prompt.count("<img>") + prompt.count("</img>")


def test_config_alone_implies_the_published_processor():
    """A transformers config (what the engine passes) tiles like the preset's saved processor settings."""
    for preset in SMOLVLM[::2] + INTERNVL[:1]:
        for h, w in SIZES[::3]:
            assert image_plan(hf_config(preset), h, w) == image_plan(preset, h, w), (preset, h, w)


# ---- weights and KV cache --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", NEW)
def test_parameter_count_equals_a_meta_model_and_the_published_size(preset):
    config = hf_config(preset)
    auto = AutoModelForCausalLM if config.model_type in TEXT_ONLY else AutoModelForImageTextToText
    with torch.device("meta"):
        model = auto.from_config(config)
    assert parameter_count(preset) == sum(p.numel() for p in model.parameters())
    towers = {"smolvlm": ("vision_model", "connector"), "internvl": ("vision_tower", "multi_modal_projector")}
    vision = sum(p.numel() for part in towers.get(config.model_type, ()) for p in getattr(model.model, part).parameters())
    assert sum(vision_params(model_shape(preset)).values()) == vision
    stated = PUBLISHED_B[preset]  # within one unit of its last digit (publishers round or truncate)
    assert abs(parameter_count(preset) / 1e9 - float(stated)) <= 10 ** -len(stated.split(".")[1])


@pytest.mark.parametrize("preset", ["Qwen2.5-0.5B-Instruct", "Qwen3-0.6B", SMOLVLM[0], SMOLVLM[2], INTERNVL[0]])
def test_kv_bytes_per_token_equal_the_cache_transformers_fills(preset):
    """A 2-layer decoder of the preset's real widths: the K/V its cache holds per token, scaled to all layers."""
    config = hf_config(preset)
    text = config if config.model_type in TEXT_ONLY else config.text_config
    layers, text.num_hidden_layers, text.vocab_size = text.num_hidden_layers, 2, 64
    with torch.device("meta"):
        decoder = AutoModelForCausalLM.from_config(text, dtype=torch.bfloat16)
    decoder = decoder.to_empty(device="cpu").eval()
    with torch.no_grad():
        cache = decoder(input_ids=torch.arange(5)[None], use_cache=True).past_key_values
    cached = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    assert estimate(preset, device_memory_gb=8).kv_bytes_per_token == cached // 5 // 2 * layers


# ---- text-only models and the planning workload ----------------------------------------------------------------------
@pytest.mark.parametrize("preset", QWEN_TEXT)
def test_text_only_models_plan_without_images_and_refuse_them(preset):
    est = estimate(preset, device="L4", text_tokens_per_request=700)
    assert est.text_only and est.images_per_request == 0 and est.vision_weights_bytes == 0
    assert est.vision_peak_bytes == 0 and est.needed_tokens_per_request == 700
    assert est.weights_bytes == 2 * parameter_count(preset)
    with pytest.raises(ValueError, match="text-only model: images_per_request must be 0"):
        estimate(preset, device="L4", images_per_request=1)


def test_every_preset_is_listed_and_estimates():
    names = set(model_preset_names())
    assert set(NEW) <= names
    for name in names:
        est = estimate(name, device="H100 80GB")
        assert est.num_parameters == parameter_count(name) and est.kv_bytes_per_token > 0


def test_tiled_request_tokens_and_tensor_parallel_plan():
    est = estimate("InternVL3_5-4B-HF", device="L4", images_per_request=2, image_size=(1024, 768))
    plan = image_plan("InternVL3_5-4B-HF", 768, 1024)
    assert est.needed_tokens_per_request == 2 * plan.tokens + 512 and est.image_tiles == plan.tiles
    assert est.vision_tokens_per_image == plan.vision_tokens and est.resized_image == plan.resized
    small = estimate("SmolVLM2-2.2B-Instruct", device="L4", image_size=(300, 200))
    assert small.vision_tokens_per_image < est.vision_tokens_per_image
    with pytest.raises(ValueError, match="min_pixels / max_pixels apply to the Qwen-VL"):
        estimate("SmolVLM2-2.2B-Instruct", device="L4", max_pixels=10 ** 6)
    plans = {p.device: p for p in gpus_needed("InternVL3_5-8B-HF", devices=["T4", "H100 80GB"], max_model_len=8192)}
    assert plans["H100 80GB"].gpus == 1 and plans["H100 80GB"].estimate.fits


def test_idefics3_shares_the_smolvlm_rules():
    """An Idefics3 config of SmolVLM2-2.2B's widths: its meta model's parameters, and tiles as Idefics3's own
    processor counts them."""
    from transformers.models.idefics3 import Idefics3ImageProcessorPil
    cfg = {k: v for k, v in load_model_preset("SmolVLM2-2.2B-Instruct").items() if not k.startswith("_")}
    cfg = dict(cfg, model_type="idefics3", vision_config=dict(cfg["vision_config"], model_type="idefics3_vision"))
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(hf_config(cfg))
    assert parameter_count(cfg) == sum(p.numel() for p in model.parameters())
    processor = Idefics3ImageProcessorPil(size={"longest_edge": 1536}, max_image_size={"longest_edge": 384})
    for h, w in sizes(3):
        num, rows, cols = processor.get_number_of_image_patches(h, w)
        plan = image_plan(cfg, h, w)
        assert (plan.tiles, plan.vision_tokens) == (num or 1, (num or 1) * 81), (h, w)
