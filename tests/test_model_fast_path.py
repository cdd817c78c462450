"""The engine's own fast path around minivlm/model: fused projections, the vision tower on the engine's linear
backend and its patch embedding as a matrix product. Each checked against transformers' own modules."""
import pytest
import torch
from torch import nn
from transformers import AutoModelForImageTextToText

from minivlm.loader import load_checkpoint
from minivlm.model.decoder import Decoder
from minivlm.model.backends.cpu_kernels.linears import FastLinear
from minivlm.model.vision import PatchProjection
from tests.conftest import FAMILIES


@pytest.mark.parametrize("bias", [False, True])  # Qwen2/2.5-VL have no bias, Qwen3-VL has one
def test_patch_projection_equals_the_conv3d(bias):
    torch.manual_seed(0)
    conv = nn.Conv3d(3, 32, kernel_size=(2, 14, 14), stride=(2, 14, 14), bias=bias)
    patches = torch.randn(50, 3, 2, 14, 14)
    with torch.no_grad():
        expected, got = conv(patches), PatchProjection.from_conv(conv)(patches)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() < 1e-5


def test_patch_projection_refuses_a_conv_that_is_not_per_patch():
    with pytest.raises(ValueError, match="not a per-patch projection"):
        PatchProjection.from_conv(nn.Conv3d(3, 8, kernel_size=(2, 14, 14), stride=(1, 7, 7)))


@pytest.mark.parametrize("family", FAMILIES)
def test_vision_tower_runs_the_engines_linears_and_equals_hf(family, checkpoints, engines):
    tower = engines[family].model.vision.module
    assert isinstance(tower.patch_embed.proj, PatchProjection)
    assert not [n for n, m in tower.named_modules() if type(m) in (nn.Linear, nn.Conv3d)]
    assert any(isinstance(m, FastLinear) for m in tower.modules())
    hf = AutoModelForImageTextToText.from_pretrained(checkpoints[family], dtype=torch.float32).eval().model.visual
    torch.manual_seed(1)
    grid = torch.tensor([[1, 8, 12]])
    pixels = torch.randn(96, 3 * 2 * 14 * 14)
    with torch.inference_mode():
        ours, theirs = tower(pixels, grid_thw=grid, return_dict=True), hf(pixels, grid_thw=grid, return_dict=True)
    assert (ours.pooler_output - theirs.pooler_output).abs().max() < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_decoder_fuses_qkv_and_gate_up(family, engines):
    layer = engines[family].model.decoder.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, FastLinear) and isinstance(layer.mlp.gate_up_proj, FastLinear)
    assert not hasattr(layer.self_attn, "q_proj") and not hasattr(layer.mlp, "gate_proj")


def test_a_checkpoint_missing_one_projection_is_a_clear_error(checkpoints):
    _, model_type, config, _, text, _ = load_checkpoint(checkpoints["qwen2_vl"])
    del text["layers.1.self_attn.k_proj.weight"]
    with torch.device("meta"):
        decoder = Decoder(model_type, config.text_config, True)
    with pytest.raises(ValueError, match=r"missing \['layers.1.self_attn.qkv_proj.weight'\].*unexpected"):
        decoder.load_weights(text, True, "cpu", torch.float32)
